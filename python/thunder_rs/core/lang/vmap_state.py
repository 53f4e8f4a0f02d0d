"""The active ``torch.vmap`` levels of the program being traced (``core.lang.vmap``), what a
random draw under them does, and a value's physical tensor at them.

Under functorch's vmap every random op consults the innermost level's ``randomness``: ``"error"``
(the default) raises, ``"same"`` draws once for all examples, ``"different"`` draws per example.
A draw that takes no batched tensor (``torch.randn(3)``, dropout of an unbatched weight) never
reaches a batching rule, so the language context asks here before recording it: under ``"error"``
it raises eager's error, under ``"same"`` the one draw the trace records is eager's, and under
``"different"`` it is refused (the trace would draw once where eager draws per example).
"""

import contextvars

from thunder_rs.core.base.userframe import user_location
from thunder_rs.core.lang.rng import RANDOM
from thunder_rs.errors import ThunderNotImplementedError, ThunderRuntimeError

#: sizes of the active thunder_rs vmap levels, outermost first
levels: contextvars.ContextVar = contextvars.ContextVar("thunder_rs_vmap_levels", default=())
#: the ``randomness`` of the active levels, outermost first
randomness: contextvars.ContextVar = contextvars.ContextVar("thunder_rs_vmap_randomness", default=())

#: the class of the values a level batches (``core.lang.vmap.BatchedProxy``, which registers it
#: here): what a transform traced under vmap (``core.lang.traced_grads``) wraps its results in
BATCHED: list = []


def levels_of(x) -> int:
    """How many level dims lead ``x``'s physical tensor (0: ``x`` is not batched)."""
    return x.levels if BATCHED and isinstance(x, BATCHED[0]) else 0


def physical(x, depth: int, rank: int | None = None):
    """``x``'s physical tensor with ``depth`` level dims and, when ``rank`` is given, that many
    logical dims (size-1 dims inserted after the level dims)."""
    levels = levels_of(x)
    phys = x.physical if levels else x
    logical = tuple(phys.shape[levels:])
    ones = (1,) * (depth - levels) + (1,) * (0 if rank is None else rank - len(logical))
    if not ones:
        return phys
    return phys.reshape(tuple(phys.shape[:levels]) + ones + logical)


def full(x, depth: int):
    """``x``'s physical tensor with ``depth`` level dims, each of its level's size (expanded where
    ``x`` is not batched over it): for ops that fold the levels into a dim of theirs, and for a
    transform traced under vmap (``core.lang.traced_grads``)."""
    phys = physical(x, depth)
    sizes = levels.get()[:depth]
    if tuple(phys.shape[:depth]) == sizes:
        return phys
    return phys.expand((*sizes, *phys.shape[depth:]))


#: how many draws were recorded under ``randomness="same"`` (a vmap run again eagerly must have none)
draws: contextvars.ContextVar = contextvars.ContextVar("thunder_rs_vmap_draws", default=0)

#: Random callables whose ``training`` argument (position, default) says whether they draw.
_TRAINING = {"dropout": (2, True), "dropout1d": (2, True), "dropout2d": (2, True), "dropout3d": (2, True)}
_TRAINING.update({"alpha_dropout": (2, False), "feature_alpha_dropout": (2, False), "rrelu": (3, False)})


def _draws(func, args, kwargs) -> bool:
    """Whether the call draws: dropout in eval or with ``p`` 0 returns its input untouched."""
    name = getattr(func, "__name__", "")
    if getattr(func, "__module__", "") != "torch.nn.functional" or name not in _TRAINING:
        return name not in ("multi_head_attention_forward", "lstm", "gru", "rnn_tanh", "rnn_relu")
    position, default = _TRAINING[name]
    training = args[position] if len(args) > position else kwargs.get("training", default)
    p = args[1] if len(args) > 1 else kwargs.get("p", 0.5)
    return bool(training) and (name == "rrelu" or p != 0)


def random_error(func) -> ThunderRuntimeError:
    return ThunderRuntimeError(
        f"vmap: called random operation while in randomness error mode ({getattr(func, '__name__', func)} at "
        f"{user_location()}). Please either use the 'same' or 'different' randomness flags on vmap or perform the "
        "randomness operation out of vmap"
    )


def check_draw(func, args, kwargs) -> None:
    """Raises where a random call on unbatched values under vmap would not draw as eager's does."""
    if not levels.get() or func not in RANDOM or not _draws(func, args, kwargs):
        return
    mode = randomness.get()[-1]
    if mode == "error":
        raise random_error(func)
    if mode == "same":
        draws.set(draws.get() + 1)
        return
    if mode == "different":
        raise ThunderNotImplementedError(
            f"torch.vmap: {getattr(func, '__name__', func)} under randomness='different' at {user_location()}: eager "
            "draws for each example, which thunder_rs does not batch; use randomness='same' or draw outside vmap"
        )
