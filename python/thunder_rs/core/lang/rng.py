"""Random number generator state as trace state.

Eager PyTorch draws from a generator on every call, so a traced program must too:

- calls that set or read the generator's state (``torch.manual_seed``, ``torch.seed``,
  ``torch.get_rng_state``/``set_rng_state``, their ``torch.cuda`` forms, and so
  ``torch.random.fork_rng``) take no tensor, so ``__torch_function__`` never sees them. A
  wrapper installed once in their modules records them, when this thread is tracing, as effect
  symbols that run at call time in program order; elsewhere (other threads, eager code) it calls
  the original at once;
- random torch calls without a decomposition are effect fallbacks (``RANDOM``), so they draw on
  every call, even when their result is unused; differentiated, they also return the generator
  state they started from, and their backward draws the same numbers again from it;
- random ltorch symbols (``thunder_rs.torch.random``) run whole as the torch call they stand
  for, ``generator=`` included; ``examine`` counts them, and the generator-state calls above,
  as supported;
- a generator passed as an argument is an input of each call, not a constant of the trace: the
  trace draws from a stand-in that takes the caller's generator's state on each call and gives it
  back (``core.acquisition.generator_inputs``).

Effects and random draws are never removed by DCE, merged by CSE or recomputed in the backward.
"""

import functools
import gc
import weakref

import torch
import torch.nn.functional as F

from thunder_rs.core.base.userframe import user_location
from thunder_rs.core.lang.fallback import draws_again, qualified_name, record_effect
from thunder_rs.core.lang.recorder import _current, lift_captured
from thunder_rs.errors import ThunderNotImplementedError


def _callables(owner, names: str) -> set:
    return {getattr(owner, n) for n in names.split() if hasattr(owner, n)}


#: torch callables that draw random numbers.
RANDOM: frozenset = frozenset(
    _callables(
        torch,
        "rand randn randint randperm rand_like randn_like randint_like normal bernoulli multinomial "
        "poisson binomial _standard_gamma _sample_dirichlet dropout feature_dropout alpha_dropout "
        "feature_alpha_dropout native_dropout rrelu rrelu_ _fused_dropout "
        "dropout_ feature_dropout_ alpha_dropout_ feature_alpha_dropout_",
    )
    | _callables(
        torch.Tensor,
        "bernoulli bernoulli_ multinomial uniform_ normal_ random_ exponential_ cauchy_ log_normal_ geometric_",
    )
    | _callables(
        F,
        "dropout dropout1d dropout2d dropout3d alpha_dropout feature_alpha_dropout rrelu "
        "gumbel_softmax fractional_max_pool2d fractional_max_pool3d fractional_max_pool2d_with_indices "
        "fractional_max_pool3d_with_indices multi_head_attention_forward",
    )
    # Kernels that draw inside (the dropout between stacked RNN layers): their backward must draw
    # the forward's numbers again, and an unused call must still draw.
    | _callables(torch, "lstm gru rnn_tanh rnn_relu")
    # Python functions that draw inside (their Gaussian basis): run eagerly (complex values with
    # gradients, ``complex_calls``), their backward's replay must draw the forward's basis again.
    | _callables(torch, "svd_lowrank pca_lowrank")
    | _callables(torch._C._nn, "rrelu_with_noise fractional_max_pool2d fractional_max_pool3d")
)


def is_random(func) -> bool:
    return func in RANDOM


#: Where the program first drew from each torch.Generator while traced (for ``check_generators``).
_DRAW_SITES: "weakref.WeakKeyDictionary[torch.Generator, str]" = weakref.WeakKeyDictionary()


def note_draw(kwargs: dict) -> None:
    """Notes the user's line of a call given ``generator=`` (its first draw from that generator)."""
    g = kwargs.get("generator")
    if isinstance(g, torch.Generator) and g not in _DRAW_SITES:
        _DRAW_SITES[g] = user_location()


def check_generators(consts: list, own: frozenset = frozenset()) -> None:
    """Refuses a ``torch.Generator`` the traced program created and drew from: compiled, it
    would be created once, by the trace, and go on drawing across calls where eager starts a
    fresh one each call. Found as a generator the trace's constants alone refer to (but those
    whose ids are in ``own``: the stand-ins of generator arguments, ``generator_inputs``)."""
    for g in consts:
        if isinstance(g, torch.Generator) and id(g) not in own and all(r is consts for r in gc.get_referrers(g)):
            where = _DRAW_SITES.get(g, "<unknown>")
            raise ThunderNotImplementedError(
                f"thunder_rs.jit: the traced program draws at {where} from a torch.Generator it creates; a "
                "compiled program would create it once and go on drawing from it across calls. Create the generator "
                "outside the function (and seed it there) and pass it in or read it from a module attribute"
            )


def _record(func, args: tuple, kwargs: dict, outputs: list):
    args, kwargs = lift_captured(args, kwargs)
    return record_effect(func, args, kwargs, outputs)


def _sets_state(original):
    """``manual_seed``/``seed``/``set_rng_state``: recorded with no output. ``torch.manual_seed``
    returns the default generator, as in eager; ``seed`` an ``UnknownSeed``, since the seed it
    draws exists only when the call runs."""

    def record(*args, **kwargs):
        _record(original, args, kwargs, [])
        draws_again.uses += 1
        if original is _manual_seed:
            return torch.default_generator
        return UnknownSeed(qualified_name(original), user_location()) if original.__name__ == "seed" else None

    return record


class UnknownSeed:
    """What ``torch.seed()`` returns while traced: the seed it draws exists only when a compiled
    call runs, so a program that uses it (Reformer keeps ``torch.seed() % sys.maxsize`` to reseed
    with) is refused naming the call's line, where it would get a wrong value or a TypeError."""

    __slots__ = ("name", "where")

    def __init__(self, name: str, where: str):
        self.name, self.where = name, where

    def refuse(self, *args, **kwargs):
        raise ThunderNotImplementedError(
            f"{self.name} at {self.where}: the program uses the seed it returns, which a compiled call draws only "
            "when it runs; seed with torch.manual_seed(<a known value>) there, or draw the seed outside the "
            "jitted function and pass it in"
        )

    def __repr__(self) -> str:
        return f"<the seed {self.name} draws at {self.where}>"


for _use in (
    "__int__ __index__ __float__ __bool__ __hash__ __eq__ __ne__ __lt__ __le__ __gt__ __ge__ __str__ __format__ "
    "__add__ __radd__ __sub__ __rsub__ __mul__ __rmul__ __mod__ __rmod__ __floordiv__ __rfloordiv__ __truediv__ "
    "__rtruediv__ __pow__ __rpow__ __and__ __rand__ __or__ __ror__ __xor__ __rxor__ __neg__ __abs__"
).split():
    setattr(UnknownSeed, _use, UnknownSeed.refuse)


def _reads_state(original):
    """``get_rng_state``: recorded with the state tensor as its output, read when the call runs."""

    def record(*args, **kwargs):
        return _record(original, args, kwargs, [original(*args, **kwargs)])[0]

    return record


def _sets_default(original):
    """``set_default_dtype`` and ``set_default_device``: recorded, so that every call changes the
    default as eager does and the creation calls after it (``torch.ones(2)``, which read the default
    when they run) see it; applied now too, so that the trace records what they make."""

    def record(*args, **kwargs):
        _record(original, args, kwargs, [])
        return original(*args, **kwargs)

    return record


def _intercept(original, recorder):
    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        if _current.get() is None:
            return original(*args, **kwargs)
        return recorder(*args, **kwargs)

    wrapper.__thunder_rs_original__ = original
    return wrapper


# ``get_rng_state_all``/``set_rng_state_all`` call ``get_rng_state``/``set_rng_state`` per device.
_SETTERS = "manual_seed seed set_rng_state manual_seed_all seed_all"
_GETTERS = "get_rng_state"
_manual_seed = torch.random.manual_seed

#: Names of the symbols that set or read generator state: known effects, not eager fallbacks.
STATE_CALLS: set[str] = set()


def _install(modules) -> None:
    originals: dict[int, object] = {}
    for module in modules:
        for name in (*_SETTERS.split(), *_GETTERS.split()):
            current_fn = getattr(module, name, None)
            if current_fn is None or hasattr(current_fn, "__thunder_rs_original__"):
                continue
            original = originals.get(id(current_fn))
            if original is None:
                make = _reads_state if name in _GETTERS else _sets_state
                original = originals[id(current_fn)] = _intercept(current_fn, make(current_fn))
                STATE_CALLS.add(qualified_name(current_fn))
            setattr(module, name, original)


_install((torch, torch.random, torch.cuda, torch.cuda.random))
STATE_CALLS.add(qualified_name(torch.set_default_dtype))
torch.set_default_dtype = _intercept(torch.set_default_dtype, _sets_default(torch.set_default_dtype))
# ``set_default_device`` likewise: the factory calls after it put their tensors there (``creation``).
STATE_CALLS.add(qualified_name(torch.set_default_device))
torch.set_default_device = _intercept(torch.set_default_device, _sets_default(torch.set_default_device))
