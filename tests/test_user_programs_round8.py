"""Programs as users write them, round 8, each next to eager over several calls while the Python
state they read changes between calls: random, NumPy and torch generators read, seeded or forked in
the program, ``functools`` caches and partials, ``threading.local`` and context variables, frozen
dataclasses and ``enum.Flag`` configs replaced between calls, logging levels and warnings filters,
``os.environ``, ``math`` and ``statistics`` on ``.item()`` values, ``weakref``s, class attributes,
and data-dependent branches and loops (``while err > tol``, ``if torch.isnan(loss)``, ``if
mask.any()``, ``.tolist()`` driving a split, generators walked in the forward). The programs sit in
``user_programs_round8.py``.

What differed: a module reading its parent through a ``weakref.ref`` (``self._parent().temperature``)
kept the first call's temperature, silently: the observer's read chains stopped at the call, so
nothing guarded what the referent held (``code_reads.CALLED``, ``AttributeReads._referent``).
Class attributes read through ``type(self).scale`` or ``self.__class__.scale`` were not guarded
either (the value changed between calls kept the first one's), and a counter of calls kept there
(``type(self).calls += 1``) counted the traced call alone, where eager counts each; they are read
as the class's attributes now (``code_reads._class_chains``), so the counter is refused naming the
line that reads it. A mixture of experts returning the token counts it split by
(``bincount(...).tolist()``) returned thunder_rs's symbolic ints once its sizes were traced
symbolic (printing them raised inside thunder_rs): the list, held by the recording among the
split's arguments, was taken for one found in state and returned as it was
(``returned_identities._made_while_tracing``). A drop-path decided by ``torch.rand(()).item()``
whose every layer was skipped (the program returns its input) raised thunder_rs's internal
``Diverged`` under grad mode: the first call took the traced call's outputs, None, for none
computed, and ran the program again with the generators past its draws (``snapshots.NOT_TAKEN``).

A generator passed in and walked (``for s in scales``) was refused naming its position among the
flat inputs and no line; it names the argument and the line that resumed it
(``Observer._note_resumed``). Attributes of what a property returns (``self.holder.scale``) kept
the first call's values too: a getter that returns a chain of ``self`` (``return self._holder``)
is followed now (``AttributeReads._through_property``); a getter doing more (a branch, an item by
a computed key) or a method (``self.get_holder().scale``, ``self.holder_for(True).scale``) was not,
and kept the first call's value: the rest of the chain is followed from what it returns, reported
by the profile hook at its return (``AttributeReads._await_result``, ``take_result``).

A list a program makes, passes to an op and returns (``x.split(sizes)``, ``torch.cat(parts)``,
``F.pad(x, pads)``) was the same list on every call (what a caller appended came back), held by
the recording among the op's arguments and so taken for one found in state: the program's own
calls record copies of their containers (``langctx._own_containers``); one found in state or
given is still that object.

Dynamo itself traces through an ``lru_cache`` (its cache stays empty under ``torch.compile``, as
with ``backend="eager"``) and does not guard ``os.environ``: those are left to it."""

import copy
import inspect
import warnings

import pytest
import torch
from torch import nn

import thunder_rs
import user_programs_round8 as programs
from test_dynamo_backend import compiled_by_thunder_rs, fresh_dynamo  # noqa: F401 (a fixture)
from test_user_programs_round7 import _assert_same, _compile, _eager
from thunder_rs.errors import ThunderNotImplementedError

pytestmark = pytest.mark.usefixtures("one_thread")

COMPILERS = pytest.mark.parametrize("compile_it", [thunder_rs.jit, _compile], ids=["jit", "torch_compile"])

PROGRAMS = [
    programs.fork_rng_noise,
    programs.saved_rng_state,
    programs.torch_drop_path,
    programs.own_random_instance,
    programs.numpy_generator_per_epoch,
    programs.manual_seed_in_forward,
    programs.lru_cached_mask,
    programs.cached_shape,
    programs.partial_keywords,
    programs.thread_local_flag,
    programs.frozen_config_replaced,
    programs.logging_level,
    programs.warnings_filters,
    programs.warns_once,
    programs.environment_knob,
    programs.python_statistics_of_items,
    programs.math_on_sizes,
    programs.copied_context,
    programs.weakref_to_a_parent,
    programs.class_attributes_through_the_type,
    programs.assert_finite,
    programs.skips_a_nan_loss,
    programs.sinkhorn_until_converged,
    programs.newton_on_items,
    programs.loss_if_any_masked,
    programs.split_by_tolist,
    programs.sorted_mixture_of_experts,
    programs.generator_of_blocks,
    programs.islice_to_a_depth,
]


@COMPILERS
@pytest.mark.parametrize("program", PROGRAMS, ids=[p.__name__ for p in PROGRAMS])
def test_a_program_over_several_calls_is_eagers(program, compile_it):
    if compile_it is _compile and program is programs.environment_knob:
        pytest.skip("Dynamo does not guard os.environ reads (as with backend='eager')")
    if compile_it is _compile and program is programs.lru_cached_mask:  # Dynamo traces through the cache
        program = _no_cache_state
    expected = program(_eager)
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="thunder_rs backend")  # no graph runs eagerly
        _assert_same(program(compile_it), expected)


def _no_cache_state(compile_it) -> list:
    return programs.lru_cached_mask(compile_it, cache_state=False)


def line_of(code, marker: str) -> str:
    lines, first = inspect.getsourcelines(code)
    return f"{inspect.getsourcefile(code)}:{first + next(i for i, line in enumerate(lines) if marker in line)}"


def test_the_list_of_counts_a_program_splits_by_and_returns_is_a_list_of_ints_each_call():
    # Returned thunder_rs's SymInts once the sizes were traced symbolic (the second compile).
    torch.manual_seed(0)
    run = thunder_rs.jit(programs.SortedMoE())
    for _ in range(3):
        _, counts = run(torch.randn(5, 4))
        assert all(type(n) is int for n in counts) and sum(counts) == 5
    assert thunder_rs.cache_misses(run) >= 2


def _skipped_after_two_draws(x):
    for _ in range(2):  # (layers of a drop-path, each skipped: the program returns its input)
        if torch.rand(()).item() < 2.0:
            continue
        x = x * 2
    return x


@pytest.mark.parametrize("requires_grad", [False, True], ids=["no_grad", "grad"])
def test_a_program_returning_its_input_after_draws_draws_once_per_call(requires_grad):
    # With a gradient: raised thunder_rs's internal Diverged on the first call, which ran the
    # program a second time after the traced call's outputs, None (its input alone), were taken.
    def calls(compile_it) -> list:
        torch.manual_seed(0)
        x = torch.randn(3, requires_grad=requires_grad)
        run = compile_it(_skipped_after_two_draws)
        return [run(x) for _ in range(3)] + [torch.rand(2)]

    _assert_same(calls(thunder_rs.jit), calls(_eager))


REFUSED = [
    (programs.numpy_random_flip, programs._random_flip, "# flips", "numpy.random.rand"),
    (programs.perf_counter_timings, programs.Timed.forward, "# times", "time.perf_counter"),
    (programs.global_iterator, programs._scheduled, "# takes the next scale", "next"),
    (programs.class_attribute_counter, programs.Counted.forward, "# counts", "class attribute 'calls' of Counted"),
    (programs.generator_argument, programs._scaled_by, "# walks the generator", "generator 'scales'"),
]
REFUSED_IDS = ["numpy_random", "perf_counter", "global_iterator", "class_counter", "generator_argument"]


@pytest.mark.parametrize("program, code, marker, what", REFUSED, ids=REFUSED_IDS)
def test_state_a_compiled_call_cannot_read_again_is_refused_naming_the_users_line(program, code, marker, what):
    # The class counter: counted the traced call alone (1 where eager counts 3), silently. The
    # generator: refused naming its position among the flat inputs, without a line.
    line = line_of(code, marker)
    with pytest.raises(ThunderNotImplementedError, match=rf"(?s)(?=.*{what})(?=.*{line}\b)"):
        program(thunder_rs.jit)


@pytest.mark.parametrize("program, code, marker, what", REFUSED, ids=REFUSED_IDS)
def test_under_torch_compile_they_run_as_eager(program, code, marker, what):
    expected = program(_eager)
    torch._dynamo.reset()
    _assert_same(program(_compile), expected)


class _Holder:
    scale = 1.0


class _ThroughAProperty(nn.Module):
    def __init__(self, holder):
        super().__init__()
        self._holder = holder

    @property
    def holder(self):
        return self._holder

    def forward(self, x):
        return x * self.holder.scale


class _ThroughABranchingProperty(_ThroughAProperty):
    @property
    def holder(self):
        return self._holder if self.training else _Holder()


def _scales_read(model) -> list:
    holder = model._holder
    run, seen = thunder_rs.jit(model), []
    for scale in (1.0, 3.0, 0.5):
        holder.scale = scale
        seen.append(run(torch.ones(1)))
    return seen


def test_an_attribute_of_what_a_property_returns_changed_between_calls_is_read_again():
    # Kept the first call's scale: the read after the getter's call was not guarded.
    _assert_same(_scales_read(_ThroughAProperty(_Holder())), [torch.full((1,), s) for s in (1.0, 3.0, 0.5)])


def test_an_attribute_of_what_a_branching_property_returns_changed_between_calls_is_read_again():
    _assert_same(_scales_read(_ThroughABranchingProperty(_Holder())), [torch.full((1,), s) for s in (1.0, 3.0, 0.5)])


class _Scaled:
    def __init__(self, scale):
        self.scale = scale


class _Chooses(nn.Module):
    """Reads ``scale`` of what a getter returns, the getter choosing between two holders."""

    def __init__(self):
        super().__init__()
        self._a, self._b, self.use_a = _Scaled(1.0), _Scaled(2.0), True
        self._by_name, self.name = {"a": self._a, "b": self._b}, "a"
        self._listed, self.index = [self._a, self._b], 0

    @property
    def holder(self):
        return self._a if self.use_a else self._b

    def get_holder(self):
        return self._a if self.use_a else self._b

    def holder_for(self, use_a):
        return self._a if use_a == self.use_a else self._b

    @property
    def named(self):
        return self._by_name[self.name]  # (an item by a key computed)

    def at_index(self):
        return self._listed[self.index]


class _ByProperty(_Chooses):
    def forward(self, x):
        return x * self.holder.scale


class _ByMethod(_Chooses):
    def forward(self, x):
        return x * self.get_holder().scale


class _ByMethodWithArguments(_Chooses):
    def forward(self, x):
        return x * self.holder_for(True).scale


class _ByComputedKey(_Chooses):
    def forward(self, x):
        return x * self.named.scale + self.at_index().scale


class _BySubmodule(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = _ByProperty()

    def forward(self, x):
        return self.inner(x) + x * self.inner.holder.scale


GETTERS = [_ByProperty, _ByMethod, _ByMethodWithArguments, _ByComputedKey, _BySubmodule]


def _getter_calls(model, compile_it) -> list:
    chooses = getattr(model, "inner", model)
    run, seen = compile_it(model), []
    changes = [("_a", "scale", 3.0), (None, "use_a", False), ("_b", "scale", 7.0), (None, "name", "b")]
    changes += [(None, "index", 1), ("_a", "scale", 0.5), (None, "use_a", True)]
    for holder, name, value in [(None, "use_a", True), *changes]:
        setattr(chooses if holder is None else getattr(chooses, holder), name, value)
        seen.append(run(torch.ones(2)))
    return seen


@COMPILERS
@pytest.mark.parametrize("make", GETTERS, ids=[m.__name__[1:] for m in GETTERS])
def test_what_a_getter_or_method_returns_and_its_attributes_changed_between_calls_are_read_again(make, compile_it):
    # Kept the first call's scale, silently: a getter doing more than ``return self._a`` (a branch,
    # a method, an item by a computed key) was not followed, so nothing guarded what it returned.
    expected = _getter_calls(make(), _eager)
    torch._dynamo.reset()
    _assert_same(_getter_calls(make(), compile_it), expected)


def _split_and_sizes(x):
    sizes = [2, 4]
    return x.split(sizes)[0], sizes


def _torch_split(x):
    sizes = [2, 4]
    return torch.split(x, sizes), sizes


def _cat_parts(x):
    parts = [x, x * 2]
    return torch.cat(parts), parts


def _pad(x):
    pads = [1, 0]
    return nn.functional.pad(x, pads), pads


def _view(x):
    shape = [3, 2]
    return x.view(shape), shape


def _permute(x):
    dims = [1, 0]
    return x.view(2, 3).permute(dims), dims


def _nested(x):
    config = {"sizes": [2, 4], "dims": [[1, 0]]}
    first, _ = x.split(config["sizes"])
    return x.view(2, 3).permute(config["dims"][0]) + first.sum(), config


def _made_by_a_creation(x):
    shape = [2, 3]
    return torch.zeros(shape) + x.view(shape), shape


OPS_GIVEN_A_LIST = [_split_and_sizes, _torch_split, _cat_parts, _pad, _view, _permute, _nested, _made_by_a_creation]


def _appended_by_the_caller(run) -> list:
    seen = []
    for _ in range(3):
        out, made = run(torch.arange(6.0))
        seen.append((out, copy.deepcopy(made)))
        (made if type(made) is list else made["sizes"]).append("caller's")  # (eager: that call's list alone)
    return seen


@COMPILERS
@pytest.mark.parametrize("program", OPS_GIVEN_A_LIST, ids=[p.__name__[1:] for p in OPS_GIVEN_A_LIST])
def test_a_list_the_program_makes_passes_to_an_op_and_returns_is_a_new_list_each_call(program, compile_it):
    # Was the same list on every call (held by the recording among the op's arguments, it was
    # taken for one found in state): what a caller appended to it came back from later calls.
    # torch.cat's list of tensors was refused as a tensor stored in a list that outlives the call.
    expected = _appended_by_the_caller(program)
    torch._dynamo.reset()
    _assert_same(_appended_by_the_caller(compile_it(program)), expected)


_SIZES = [2, 4]


class _SplitsByItsSizes(nn.Module):
    def __init__(self):
        super().__init__()
        self.sizes = [2, 4]

    def forward(self, x):
        return x.split(self.sizes), self.sizes


def _split_by_the_global(x):
    return x.split(_SIZES), _SIZES


def _split_by_the_argument(x, sizes):
    return x.split(sizes), sizes


@COMPILERS
def test_a_list_found_in_state_or_given_passed_to_an_op_and_returned_is_that_list(compile_it):
    model, given = _SplitsByItsSizes(), [3, 3]
    runs = [
        (compile_it(_split_by_the_global), (), _SIZES),
        (compile_it(model), (), model.sizes),
        (compile_it(_split_by_the_argument), (given,), given),
    ]
    for run, extra, state in runs:
        for _ in range(2):
            assert run(torch.arange(6.0), *extra)[1] is state
