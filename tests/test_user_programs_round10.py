"""Programs as users write them, round 10, each next to eager over several calls while the Python
state or the input data change between calls: data-dependent branches as model code writes them
(``if (y > 0).all()``, an early ``return`` when every token is padding, ``if x.numel() == 0``, a
beam-like ``while not finished.all()``, conjugate gradients until a tolerance, ``torch.where`` next
to a Python ``if`` on ``.item()``, HF Mixtral's routing skipping the experts no token chose, nested
branches in submodules, branches under ``no_grad`` and autocast, a ``break`` on a confident
prediction, a GradScaler-like skip on non-finite gradients, ``bool()`` of a 0-dim tensor,
``math.isclose`` on items), the branch taken changing both ways with gradients compared; and Python
state read through the standard library (generators of ``random`` and NumPy, ``itertools.count``
and ``cycle`` held by a module, ``functools.cache`` of a tensor, ``deque``, ``Counter`` and
``defaultdict`` state, a ``ContextVar`` set and reset inside, ``enum`` modes, ``dataclasses.replace``
configs, a ``WeakKeyDictionary`` keyed by the module, ``operator.attrgetter``/``itemgetter``,
``copy.deepcopy`` of a submodule, ``inspect.signature`` dispatch, logging of items, warnings once
per location). The programs sit in ``user_programs_round10.py`` and ``user_programs_round10_state.py``.

What differed, silently: a list or dict held in a dict or list of lasting state and reached by a key
the program computes (``self.seen[x.shape[1]].append(n)`` on a ``defaultdict(list)``) kept what the
traced call put there (thunder_rs's symbolic sizes, once the sizes were symbolic) and compiled calls
changed nothing in it; its contents changed between calls by the user were not seen either. Such
containers are noted with the one holding them now, their changes made again by every call, each
guarded with its items (``containers.StateContainers._note_held``). A read by a path the observer
does not follow (``operator.attrgetter("block.gain")(self)``, ``self.get_submodule("block.0").gain``,
``functools.reduce(getattr, path.split("."), self)``, ``vars(cfg)["sub"].scale``) kept the first
call's ``block.gain``: only ``self`` was read whole; such a code reads its objects and what they hold
whole (``code_reads.ALL_NESTED``, ``AttributeReads._read_nested``).

Refused without the user's line, now named: a tensor stored in a ``deque`` of state (also naming the
deque), a draw from a generator a module holds (the line of the method's ``def`` was named), and
``copy.deepcopy`` of a module inside the program (refused as "a tensor it computed (input t1)" stored
in a list; ``stdlib_readers._module_deepcopy`` refuses it by name).

Draws from a ``random.Random``, a NumPy generator or ``random``'s global one, ``next`` of an
``itertools.count``/``cycle`` a module holds, and a cache keyed by the module's identity are refused
by ``thunder_rs.jit`` naming the line (a compiled call cannot draw or advance them again); under
``torch.compile`` Dynamo runs them as eager. Dynamo itself traces through a ``functools.cache`` (the
cache stays empty) and keeps a deque's first state (``backend="eager"`` too): left to it."""

import collections
import functools
import inspect
import operator
import warnings

import pytest
import torch
from torch import nn

import thunder_rs
import user_programs_round10 as programs
import user_programs_round10_state as state
from test_dynamo_backend import compiled_by_thunder_rs, fresh_dynamo  # noqa: F401 (a fixture)
from test_user_programs_round7 import _assert_same, _compile, _eager
from thunder_rs.errors import ThunderNotImplementedError, ThunderRuntimeError

pytestmark = pytest.mark.usefixtures("one_thread")

COMPILERS = pytest.mark.parametrize("compile_it", [thunder_rs.jit, _compile], ids=["jit", "torch_compile"])

PROGRAMS = [
    programs.all_positive_branch,
    programs.all_padding_early_return,
    programs.numel_zero_branch,
    programs.beam_like_loop,
    programs.where_and_item_branch,
    programs.mixtral_like_routing,
    programs.nested_submodule_branches,
    programs.branch_under_no_grad,
    programs.branch_under_autocast,
    programs.conjugate_gradient_refinement,
    programs.grad_scaler_like_skip,
    programs.confident_early_exit,
    programs.best_loss_attribute,
    programs.tensor_truthiness,
    programs.short_circuit_reads,
    programs.count_sized_topk,
    programs.isclose_on_items,
    state.held_random_instance,
    state.global_random_decision,
    state.held_numpy_generator,
    state.held_itertools_count,
    state.held_itertools_cycle,
    state.functools_cache_of_a_tensor,
    state.deque_ring_buffer,
    state.counter_of_predictions,
    state.defaultdict_of_shapes,
    state.context_var_set_inside,
    state.enum_mode_switch,
    state.dataclass_replaced_between_calls,
    state.weak_key_dictionary_cache,
    state.attrgetter_itemgetter,
    state.deepcopy_inside,
    state.inspect_signature_dispatch,
    state.logging_a_data_dependent_value,
    state.warn_once_per_location,
    state.raised_errors,
]
#: Programs Dynamo itself runs otherwise than eager (``backend="eager"`` too): left to it.
DYNAMO_DIFFERS = {
    state.functools_cache_of_a_tensor: "Dynamo traces through functools.cache (its cache stays empty)",
    state.deque_ring_buffer: "Dynamo keeps the deque's contents of the first call",
}
#: Programs thunder_rs.jit refuses (``test_refused_by_jit_naming_the_line``).
JIT_REFUSED = [
    (state.held_random_instance, state.HeldRandomFlip.forward, "# draws from the held", "random.Random"),
    (state.global_random_decision, state._global_random_jitter, "# draws from random's", "random.random"),
    (state.held_numpy_generator, state.HeldNumpyGenerator.forward, "# draws from the held", "numpy.random"),
    (state.held_itertools_count, state.StepCounted.forward, "# advances the counter", "next"),
    (state.held_itertools_cycle, state.CycledScales.forward, "# advances the cycle", "next"),
    (state.weak_key_dictionary_cache, state.WeakCached.forward, "# keyed by the module", "identity of the module"),
    (state.deque_ring_buffer, state.RingBuffer.forward, "self.history.append", "collections.deque"),
    (state.deepcopy_inside, state.DeepCopiedTeacher.forward, "# copies the parameters", "copy.deepcopy"),
]
JIT_REFUSES = {r[0] for r in JIT_REFUSED}


@COMPILERS
@pytest.mark.parametrize("program", PROGRAMS, ids=[p.__name__ for p in PROGRAMS])
def test_a_program_over_several_calls_is_eagers(program, compile_it):
    if compile_it is _compile and program in DYNAMO_DIFFERS:
        pytest.skip(DYNAMO_DIFFERS[program])
    if compile_it is thunder_rs.jit and program in JIT_REFUSES:
        pytest.skip("refused naming the line: test_refused_by_jit_naming_the_line")
    expected = program(_eager)
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="thunder_rs backend")  # no graph runs eagerly
        _assert_same(program(compile_it), expected)


def _line_of(code, marker: str) -> str:
    lines, first = inspect.getsourcelines(code)
    return f"{inspect.getsourcefile(code)}:{first + next(i for i, line in enumerate(lines) if marker in line)}"


@pytest.mark.parametrize("program, code, marker, what", JIT_REFUSED, ids=[r[0].__name__ for r in JIT_REFUSED])
def test_refused_by_jit_naming_the_line(program, code, marker, what):
    # The deque: refused without the line or the container ("in Python state outside the trace").
    # The deepcopy: refused as "a tensor it computed (input t1) stored in a list", with no line. The
    # draws from a held generator named the line of the method's ``def``.
    line = _line_of(code, marker)
    with pytest.raises((ThunderNotImplementedError, ThunderRuntimeError), match=rf"(?s)(?=.*{what})(?=.*{line}\b)"):
        program(thunder_rs.jit)


# -- lists and dicts held by the containers of lasting state --------------------------------------


class _Holds(nn.Module):
    def __init__(self, table):
        super().__init__()
        self.table = table

    def forward(self, x):
        self.table[x.shape[1]].append(x.shape[0])  # by a computed key
        return x * len(self.table[x.shape[1]])


@pytest.mark.parametrize(
    "make",
    [lambda: {3: [], 5: []}, lambda: collections.defaultdict(list), lambda: [[] for _ in range(6)]],
    ids=["dict", "defaultdict", "list"],
)
def test_a_list_held_in_a_container_of_state_and_appended_by_a_computed_key_grows_as_in_eager(make):
    # Kept [2, SymInt(t0, hint=4)]: the traced call's append, compiled calls appending nothing.
    got, expected = _Holds(make()), _Holds(make())
    run = thunder_rs.jit(got)
    for b, n in ((2, 3), (4, 3), (5, 3), (2, 5), (3, 3)):
        _assert_same(run(torch.ones(b, n)), expected(torch.ones(b, n)))
        assert got.table == expected.table
        held = got.table.values() if isinstance(got.table, dict) else got.table
        assert all(type(v) is int for items in held for v in items)
    assert thunder_rs.cache_misses(run) == 5  # (each call finds the list changed: as a global list)


class _ReadsHeld(nn.Module):
    def __init__(self):
        super().__init__()
        self.scales = {"a": [1.0, 2.0], "b": {"gain": 3.0}}

    def forward(self, x, key: str):
        held = self.scales[key]
        return x * (held[1] if key == "a" else held["gain"])


def test_a_list_or_dict_held_in_state_changed_between_calls_is_read_again():
    # Kept the first call's item, silently: only the outer dict was guarded.
    model = _ReadsHeld()
    run = thunder_rs.jit(model)
    for key, change in (("a", None), ("a", ("a", 1, 5.0)), ("b", None), ("b", ("b", "gain", 7.0)), ("a", None)):
        if change:
            model.scales[change[0]][change[1]] = change[2]
        _assert_same(run(torch.ones(2), key), model(torch.ones(2), key))
    assert thunder_rs.cache_misses(run) == 5  # (each entry guards every list and dict held there)


# -- reads by a path ------------------------------------------------------------------------------


class _ByPath(nn.Module):
    def __init__(self, how: str):
        super().__init__()
        self.block = nn.Sequential(nn.Identity())
        self.block[0].gain = 2.0
        self.how, self.path = how, "block.0.gain"

    def forward(self, x):
        if self.how == "attrgetter":
            return x * operator.attrgetter(self.path)(self)
        if self.how == "reduce":
            return x * functools.reduce(getattr, self.path.split("."), self)
        if self.how == "get_submodule":
            return x * self.get_submodule("block.0").gain
        return x * operator.attrgetter("block")(self)[0].gain


class _Sub:
    scale = 2.0


class _Config:
    def __init__(self):
        self.sub = _Sub()


_CONFIG = _Config()


def _config_by_path(x):
    return x * operator.attrgetter("sub.scale")(_CONFIG)


def _config_by_vars(x):
    return x * vars(_CONFIG)["sub"].scale


@COMPILERS
@pytest.mark.parametrize("how", ["attrgetter", "reduce", "get_submodule", "attrgetter_then_item", "object", "vars"])
def test_an_attribute_read_by_a_path_changed_between_calls_is_read_again(how, compile_it):
    # Kept the first call's gain, silently: only the module (or config) itself was read whole.
    if how in ("object", "vars"):
        _CONFIG.sub.scale = 2.0
        run = compile_it(_config_by_path if how == "object" else _config_by_vars)
        seen = [run(torch.ones(1))]
        _CONFIG.sub.scale = 5.0
        seen.append(run(torch.ones(1)))
    else:
        model = _ByPath(how)
        run = compile_it(model)
        seen = [run(torch.ones(1))]
        model.block[0].gain = 5.0
        seen.append(run(torch.ones(1)))
    seen.append(run(torch.ones(1)))
    _assert_same(seen, [torch.full((1,), 2.0), torch.full((1,), 5.0), torch.full((1,), 5.0)])
    if compile_it is thunder_rs.jit:
        assert thunder_rs.cache_misses(run) == 2
