"""Programs as users write them, round 13, each next to eager over several calls while the Python
state or the input data change between calls: key-value caches (Whisper's ``EncoderDecoderCache``
stepped by hand, a ``DynamicCache`` cropped and reordered between calls, a ``StaticCache`` reset
between prompts, Mistral's sliding window and a beam search generated, a cache written by slice
assignment at a position read from a tensor, a list cache cropped and reordered), branches on
tensor values (``if mask.any()`` per layer, ``torch.equal``, a ``while`` loop to a tolerance, a
layer chosen by ``argmax().item()``, ``tolist`` keys, boolean-mask writes, ``nonzero`` into
``index_add_``, ``torch.unique`` routing, top-p and a repetition penalty, ``searchsorted``, an
``assert`` on ``isfinite``), and the standard library's state (``decimal``'s context, an
``OrderedDict`` LRU, ``bisect.insort``, ``heapq``, ``itertools.accumulate``, a ``random.Random``
made inside, ``queue.Queue``, ``StringIO``, ``contextlib.suppress``, a lock, a
``WeakValueDictionary``, ``namedtuple._replace``, ``dataclasses.asdict``, a ``Semaphore`` and an
``Event``). Outputs, gradients,
state left behind and errors are compared with eager. The programs sit in ``user_programs_round13*.py``.

What differed, silently: ``decimal``'s arithmetic kept the precision of the traced call's context
(``decimal.getcontext().prec`` set between calls): the context is guarded where the program reads
``decimal`` or one of its names (``torch_flags._decimal_context``). An object of the user's classes
held in a list or dict of state and reached by a computed key or a loop (``TABLES[name].value``,
``for cfg in CONFIGS``; or from a ``WeakValueDictionary``'s ``get``, through a weak reference) kept
its attributes' traced values: each is guarded whole (``containers._held_objects``; in a tuple,
and with slots, too). A ``threading.Semaphore`` acquired by the program (its own code reads and
sets ``_value``, unobserved) kept the traced count's branch and set the traced count again: the
plain attributes of an object of the standard library's classes whose method the program calls
are guarded by value (``AttributeReads._stdlib_object_read``; ``ProgramState.guard_written``). A
``queue.Queue`` the program ``put`` to was put to by the traced call alone (a later symbolic trace
left a symbolic int in it): its deque is compared as a container's items, and the change refused
naming the line, the queue left as it was. A held object of the user's classes that the program
changes (``for t in TRACKERS: t.count += 1``, counted by the traced call alone) is refused naming
the line that read the container, its attributes put back.

A ``StringIO`` passed in and written to stays refused naming the line. Dynamo itself
(``backend="eager"`` too) raises ``RuntimeError`` for a failed ``assert`` on tensor values, and
keeps an ``OrderedDict``'s first order after ``move_to_end``: left to it."""

import decimal
import queue
import warnings
import weakref

import pytest
import torch
from torch import nn

import thunder_rs
import user_programs_round13 as programs
import user_programs_round13_state as state
from test_dynamo_backend import compiled_by_thunder_rs, fresh_dynamo  # noqa: F401 (a fixture)
from test_user_programs_round7 import _compile, _eager
from test_user_programs_round11 import _assert_same
from test_user_programs_round12 import _line

pytestmark = pytest.mark.usefixtures("one_thread")

PROGRAMS = [
    programs.mask_any_per_layer,
    programs.equal_and_allclose,
    programs.while_to_tolerance,
    programs.argmax_item_picks_a_layer,
    programs.tolist_as_keys,
    programs.boolean_mask_write_with_grad,
    programs.nonzero_feeds_index_add,
    programs.unique_counts_route_experts,
    programs.top_p_and_repetition_penalty,
    programs.searchsorted_to_an_int,
    programs.slice_assigned_cache_at_a_tensor_position,
    programs.cache_cropped_and_reordered_between_calls,
    programs.assert_isfinite_all,
    programs.max_above_threshold,
    state.decimal_context_precision,
    state.ordered_dict_lru,
    state.insort_into_a_list,
    state.heapq_nlargest_of_tolist,
    state.accumulate_and_pairwise,
    state.random_instance_made_inside,
    state.suppressed_shape_error,
    state.lock_and_version_info,
    state.weak_value_dictionary,
    state.namedtuple_replace,
    state.asdict_and_fields,
    state.semaphore_and_event,
]
#: Programs Dynamo itself runs otherwise than eager (``backend="eager"`` too): left to it.
DYNAMO_DIFFERS = {
    programs.assert_isfinite_all: "Dynamo raises RuntimeError where eager's assert raises AssertionError",
    state.ordered_dict_lru: "Dynamo keeps the OrderedDict's first order after move_to_end",
}
#: Under torch.compile in the default run: one of each kind; the others are marked slow.
COMPILED_BY_DEFAULT = {
    programs.mask_any_per_layer,
    programs.slice_assigned_cache_at_a_tensor_position,
    state.decimal_context_precision,
    state.weak_value_dictionary,
    state.semaphore_and_event,
}


def _cases() -> list:
    cases = [pytest.param(p, thunder_rs.jit, id=f"{p.__name__}-jit") for p in PROGRAMS]
    for p in PROGRAMS:
        slow = () if p in COMPILED_BY_DEFAULT else (pytest.mark.slow,)
        cases.append(pytest.param(p, _compile, id=f"{p.__name__}-torch_compile", marks=slow))
    return cases


@pytest.mark.parametrize("program, compile_it", _cases())
def test_a_program_over_several_calls_is_eagers(program, compile_it):
    if compile_it is _compile and program in DYNAMO_DIFFERS:
        pytest.skip(DYNAMO_DIFFERS[program])
    expected = program(_eager)
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="thunder_rs backend")  # no graph runs eagerly
        _assert_same(program(compile_it), expected)


# -- generation with transformers' caches ----------------------------------------------------------

#: The generation programs, jitted in the default run where marked (a tiny model's steps compile
#: for seconds each); under torch.compile all slow (Dynamo compiles each step's graphs anew).
GENERATION = {
    "whisper_encoder_decoder_cache": True,
    "dynamic_cache_cropped_between_calls": True,
    "dynamic_cache_reordered_between_calls": False,
    "static_cache_reset_between_prompts": False,
    "sliding_window_generate_past_the_window": False,
    "beam_search_generate": True,
    "legacy_tuple_past_key_values": False,
}


def _generation_cases() -> list:
    cases = []
    for name, by_default in GENERATION.items():
        cases.append(pytest.param(name, thunder_rs.jit, id=f"{name}-jit", marks=() if by_default else pytest.mark.slow))
        cases.append(pytest.param(name, _compile, id=f"{name}-torch_compile", marks=pytest.mark.slow))  # (~50 s each)
    return cases


@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore:.*generation.*:UserWarning")
@pytest.mark.filterwarnings("ignore:thunder_rs.*recompiled")
@pytest.mark.parametrize("name, compile_it", _generation_cases())
def test_a_generation_program_is_eagers(name, compile_it):
    hf = pytest.importorskip("user_programs_round13_hf", exc_type=ImportError)
    program = getattr(hf, name)
    expected = program(_eager)
    torch._dynamo.reset()
    _assert_same(program(compile_it), expected)


# -- decimal's context ------------------------------------------------------------------------------

from decimal import Decimal  # noqa: E402 (the name the program reads, imported by itself)


def _by_an_imported_decimal(x):
    return x * float(Decimal(2) / Decimal(3))


def test_decimals_context_read_through_an_imported_name_is_guarded():
    # Kept the precision of the traced call's context, silently.
    run = thunder_rs.jit(_by_an_imported_decimal)
    try:
        for prec in (28, 2, 2, 28):
            decimal.getcontext().prec = prec
            assert torch.equal(
                run(torch.ones(2, dtype=torch.float64)), _by_an_imported_decimal(torch.ones(2, dtype=torch.float64))
            )
    finally:
        decimal.getcontext().prec = 28
    assert thunder_rs.cache_misses(run) == 2


# -- objects held in containers of state, reached by computed keys ---------------------------------


class _Table:
    def __init__(self, value: float):
        self.value = value


class _Slotted:
    __slots__ = ("value",)

    def __init__(self, value: float):
        self.value = value


_BY_NAME: dict = {}
_IN_ORDER: list = []
_WEAKLY: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_AS_TUPLE = (_Slotted(2.0), _Slotted(1.0))


def _by_a_computed_key(x, name):
    return x * _BY_NAME[name].value


def _by_a_loop(x, name):
    for table in _IN_ORDER:
        x = x * table.value
    return x


def _by_a_tuple_of_slotted(x, name):
    for table in _AS_TUPLE:
        x = x * table.value
    return x


def _by_a_weak_get(x, name):
    table = _WEAKLY.get(name)
    return x * (table.value if table is not None else -1.0)


@pytest.mark.parametrize("program", [_by_a_computed_key, _by_a_loop, _by_a_tuple_of_slotted, _by_a_weak_get])
def test_an_object_held_by_a_container_of_state_and_reached_by_a_computed_key_is_guarded(program):
    # Kept the traced value, silently: no read chain follows a computed key, a loop or a library get
    # (a tuple's objects, and objects with slots, neither).
    held = _BY_NAME["a"] = _WEAKLY["a"] = _Table(2.0)
    _IN_ORDER[:] = [held, _Table(1.0)]
    if program is _by_a_tuple_of_slotted:  # (an object with slots, in a tuple)
        held = _AS_TUPLE[0]
    run = thunder_rs.jit(program)
    for value in (2.0, 3.0, 3.0, 0.5):
        held.value = value
        assert torch.equal(run(torch.ones(2), "a"), program(torch.ones(2), "a"))
    assert thunder_rs.cache_misses(run) == 3
    _BY_NAME.clear(), _IN_ORDER.clear()
    del held
    if program is _by_a_weak_get:  # (the weak entry died: eager's call finds none, so must the entry's)
        assert torch.equal(run(torch.ones(2), "a"), program(torch.ones(2), "a"))


class _PerLayerGains(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.layers, self.named = nn.Linear(2, 2), [_Table(1.0), _Table(2.0)], {"out": _Table(3.0)}

    def forward(self, x, name: str):
        for layer in self.layers:
            x = self.lin(x) * layer.value
        return x + self.named[name].value


def test_objects_in_a_modules_list_and_dict_looped_over_or_keyed_are_guarded():
    # Kept the first gains, silently, with eager's gradients of the traced values.
    torch.manual_seed(0)
    model = _PerLayerGains()
    run, x = thunder_rs.jit(model), torch.randn(3, 2)
    for change in (lambda: None, lambda: setattr(model.layers[1], "value", 5.0), lambda: None):
        change()
        got, expected = run(x, "out"), model(x, "out")
        got.sum().backward()
        got_grad = model.lin.weight.grad.clone()
        model.zero_grad()
        expected.sum().backward()
        _assert_same([got, got_grad], [expected, model.lin.weight.grad])
        model.zero_grad()
    model.named["out"].value = -1.0
    _assert_same(run(x, "out"), model(x, "out"))
    assert thunder_rs.cache_misses(run) == 3


class _Tracker:
    def __init__(self):
        self.count = 0


_TRACKERS = [_Tracker()]


def _counts_in_held_objects(x):
    for tracker in _TRACKERS:
        tracker.count += 1
    return x * 2


def test_an_object_held_by_a_list_of_state_written_by_the_program_is_refused_and_left_as_it_was():
    # Counted once, at the traced call, silently: no compiled call counted again.
    run = thunder_rs.jit(_counts_in_held_objects)
    for _ in range(2):
        with pytest.raises(thunder_rs.errors.ThunderNotImplementedError, match="count changed from 0 to 1") as e:
            run(torch.ones(2))
        assert _line(_counts_in_held_objects, "in _TRACKERS") in str(e.value)  # (the line reading the list)
        assert _TRACKERS[0].count == 0


def test_a_string_io_passed_in_and_written_to_is_refused_naming_the_line():
    with pytest.raises(thunder_rs.errors.ThunderNotImplementedError, match="StringIO.write") as e:
        state.string_io_written(thunder_rs.jit)
    assert _line(state._reported, "out.write") in str(e.value)


# -- a queue.Queue put to ----------------------------------------------------------------------------


class _Queued(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.sink = nn.Linear(3, 3), queue.Queue()

    def forward(self, x):
        y = self.lin(x)
        self.sink.put(y.shape[0])
        return y


def test_a_queue_put_to_is_refused_naming_the_line_and_left_as_it_was():
    # The traced call alone put (a symbolic trace left a symbolic int in the queue), silently.
    model = _Queued()
    run = thunder_rs.jit(model)
    for n in (2, 3):
        with pytest.raises(thunder_rs.errors.ThunderNotImplementedError, match="not in a Queue") as e:
            run(torch.randn(n, 3))
        assert _line(_Queued.forward, "self.sink.put") in str(e.value)
    assert model.sink.qsize() == 0 and list(model.sink.queue) == []
