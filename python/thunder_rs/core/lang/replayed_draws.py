"""Dropout inside a non-reentrant activation checkpoint, drawn again in the backward as eager's
recompute draws it.

Eager's ``checkpoint(fn, ..., use_reentrant=False)`` keeps the generators' states at the region's
start (``preserve_rng_state``: the CPU one, and those of the devices of the tensors passed) and
its backward runs ``fn`` again from them inside ``fork_rng``: the recomputed dropout draws the
forward's mask, and the generators are left as they were. The traced region keeps one state per
generator and chains its draws through it: the first draw of a generator in the region reads its
state (``_generator_state``, an effect: the only value of the chain saved for the backward), each
dropout is a call of no effect that draws from the state it is given and returns, with its output
and mask, the state after (``_native_dropout_from``, leaving the generator as it found it), and an
effect sets the generator to that state (as eager's forward leaves it). ``passes::split`` computes
the region's calls again in the backward where it reads their values: a mask read there comes
from the draws of the region before it, from the saved state, bit-equal to the forward's (eager's
CPU dropout scales by ``1 / (1 - p)`` rounded to the input's dtype, which computing the output
again from a saved mask would not be), and the generator after the backward is eager's.

A chain holds while nothing else draws from or sets its generator (any draw or seeding inside
the region starts it again from the generator's state) and ends with the outermost region: a
value of one region read by another would be saved whole. A draw on a device whose state eager
does not keep, and a dropout whose input is not contiguous (the call's output is taken as dense),
keep the forward's outputs, as before.
"""

import threading

import torch

from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.core.lang.fallback import draws_again, record_effect, symbol_id
from thunder_rs.core.lang.recorder import current, output_meta, proxies


class _Chains(threading.local):
    """Per thread: the preserved generators (device names) of each checkpoint region entered, and
    per device name the last state of its chain with the count of generator uses it was made at."""

    def __init__(self) -> None:
        self.regions: list[frozenset] = []
        self.states: dict[str, tuple[TensorProxy, int]] = {}


_chains = _Chains()


def entered(preserved: frozenset) -> None:
    """A checkpoint region entered, which keeps the states of the generators in ``preserved``."""
    if not _chains.regions:
        _chains.states.clear()
    _chains.regions.append(preserved)


def exited() -> None:
    _chains.regions.pop()
    if not _chains.regions:
        _chains.states.clear()


def _generator(device: str) -> torch.Generator:
    d = torch.device(device)
    if d.type == "cpu":
        return torch.default_generator
    index = d.index if d.index is not None else torch.cuda.current_device()
    return torch.cuda.default_generators[index]


def _generator_state(device: str) -> torch.Tensor:
    return _generator(device).get_state()


def _set_generator_state(state: torch.Tensor, device: str) -> torch.Tensor:
    """Sets the generator; returns an empty tensor, so that the call is placed in its region
    (``passes::split`` takes a value a call of no output reads as read outside its region)."""
    _generator(device).set_state(state)
    return state.new_empty(0)


def _native_dropout_from(state: torch.Tensor, input: torch.Tensor, p: float, device: str):
    """``native_dropout(input, p, True)`` drawn from ``state``, and the state after; the generator
    is left as it was."""
    gen = _generator(device)
    now = gen.get_state()
    gen.set_state(state)
    try:
        out, mask = torch.native_dropout(input, p, True)
        return out, mask, gen.get_state()
    finally:
        gen.set_state(now)


def _device_name(t: TensorProxy) -> str:
    d = torch.device(t.device)
    if d.type == "cuda" and d.index is None:
        d = torch.device("cuda", torch.cuda.current_device())
    return str(d)


def replayable(input) -> bool:
    """Whether the dropout of ``input`` being traced (with grad) is drawn again in the backward
    from its region's saved state: inside checkpoints that all keep its generator's state, of a
    contiguous input. (Inside a composite that draws otherwise too, ``passes::split`` keeps the
    composite's outputs: it runs once, in the forward.)"""
    if not _chains.regions or not isinstance(input, TensorProxy):
        return False
    device = _device_name(input)
    return all(device in r for r in _chains.regions) and input.is_contiguous()


def native_dropout(input: TensorProxy, p: float) -> tuple:
    """``native_dropout(input, p, True)``'s output and mask, drawn from the chain's state (see the
    module doc). The caller has noted the draw (``refuse_draw_made_again``)."""
    device = _device_name(input)
    last = _chains.states.get(device)
    uses = draws_again.uses
    if last is not None and last[1] == uses - 1:  # (the draw being made is the only use since)
        state = last[0]
    else:
        state = record_effect(_generator_state, (device,), {}, [_generator(device).get_state()])[0]
    metas = [
        output_meta(input.shape, input.dtype, input.device, input.requires_grad),
        output_meta(input.shape, torch.bool, input.device, False),
        output_meta(state.shape, state.dtype, state.device, False),
    ]
    out, mask, after = proxies(current().call(symbol_id(_native_dropout_from), (state, input, p, device), None, metas))
    record_effect(_set_generator_state, (after, device), {}, [after.new_empty(0)])
    _chains.states[device] = (after, uses)
    return out, mask
