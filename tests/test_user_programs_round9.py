"""Programs as users write them, round 9, each next to eager over several calls while the Python
state or the inputs change between calls: a compiled function calling another (also called alone),
recursion (a tree of modules, a pyramid), ``try``/``except`` for control flow (``KeyError``,
``IndexError``, ``StopIteration``, a ``RuntimeError`` of a shape mismatch), grad mode set per call
or inside (``set_grad_enabled(flag)``, ``enable_grad`` under ``no_grad``, ``inference_mode``),
decorators (``functools.wraps``, ``torch.no_grad`` on a helper), checkpoints with dropout,
``torch.func`` transforms, hooks, walks over ``named_modules``, ``ModuleDict`` by a string argument,
keyword-only calls and ``**kwargs``, ``__getattr__`` wrappers, configs, ``bisect``/``heapq``/
``statistics`` on numbers read from tensors, ``torch.Size`` arithmetic, f-string keys and prints.
The programs sit in ``user_programs_round9.py`` and ``user_programs_round9_more.py``.

What differed: a counting decorator (``wrapper.calls += 1`` on the ``functools.wraps`` wrapper) and
any attribute of a function of the program (``step.scale``) kept the first call's value, silently:
the observer followed functions for their code, defaults and cells, not for what they hold as
attributes; a function of the program is a state object now, its attributes read and set as a
config's (``AttributeReads._keep_first``): a value changed between calls recompiles, a counter is
counted by every call (each call compiles again, as with a counter on a global object). A module
wrapper delegating through ``__getattr__`` (``getattr(self.inner, name)``) kept the first call's
value of what it delegated to (``self.temperature`` of the inner module), silently: a read by a
computed name of a module's attribute guarded nothing; it reads all of the module's attributes now
(``AttributeReads._module_read_whole``), as it did for other objects.

``torch.compiler.is_compiling()`` is True while thunder_rs traces, as under ``torch.compile``
(``core/lang/torch_overrides.py``): a program branching on it takes the compiled branch under both,
which is what a user asking the question wants; eager takes the other. A tensor a compiled call
prints that requires grad shows ``grad_fn=<CompiledFunctionBackward>`` (the node it has), as under
``torch.compile``.

Dynamo itself does not guard an ``except KeyError`` path on a dict key added later, ``x.is_leaf``,
nor backward hooks registered between calls (``backend="eager"`` gives the same), and it runs
``torch.func.grad`` and ``jacrev`` graphs eagerly with a warning: those are left to it."""

import inspect
import warnings

import pytest
import torch
from torch import nn

import thunder_rs
import user_programs_round9 as programs
import user_programs_round9_more as more
from test_dynamo_backend import compiled_by_thunder_rs, fresh_dynamo  # noqa: F401 (a fixture)
from test_user_programs_round7 import _assert_same, _compile, _eager
from thunder_rs.errors import ThunderNotImplementedError

pytestmark = pytest.mark.usefixtures("one_thread")

COMPILERS = pytest.mark.parametrize("compile_it", [thunder_rs.jit, _compile], ids=["jit", "torch_compile"])

PROGRAMS = [
    programs.nested_compiled,
    programs.recursive_tree,
    more.recursive_function,
    programs.wraps_decorator,
    programs.no_grad_decorated_helper,
    programs.key_error_fallback,
    programs.index_error_fallback,
    programs.stop_iteration_loop,
    programs.key_error_escapes,
    more.runtime_error_fallback,
    more.raises_on_shapes,
    programs.grad_enabled_flag,
    more.set_grad_enabled_as_a_call,
    programs.enable_grad_under_no_grad,
    programs.is_grad_enabled_branch,
    programs.inference_mode_inside,
    programs.is_autocast_enabled_branch,
    programs.is_leaf_branch,
    programs.is_parameter_branch,
    programs.checkpoint_dropout_non_reentrant,
    programs.checkpoint_dropout_reentrant,
    programs.func_grad_inside,
    programs.vmap_inside,
    programs.jacrev_inside,
    programs.pre_hook_changes_inputs,
    programs.backward_hook_between_calls,
    programs.named_modules_walk,
    more.apply_inside_forward,
    programs.module_dict_by_argument,
    programs.kwargs_forwarding,
    programs.keyword_only_call,
    programs.getattr_delegation,
    more.next_of_parameters,
    programs.class_level_cache,
    programs.mutable_dataclass_config,
    programs.stdlib_on_numbers,
    programs.size_arithmetic,
    programs.shape_string_keys,
    programs.prints_per_call,
    more.keyword_pre_hook,
    more.nested_batch_norm,
    more.modules_changed_between_calls,
    more.function_attribute_through_a_module,
    more.prints_an_item,
    more.returns_an_inference_tensor,
    more.dataclass_replaced_inside,
    more.table_keyed_by_torch_size,
    more.stop_iteration_of_own_generator,
    more.no_grad_inner_function_under_a_flag,
    more.class_dict_counter,
    more.optional_options_dict,
    more.view_error_fallback,
]
#: Programs Dynamo itself runs otherwise than eager (``backend="eager"`` too): left to it.
DYNAMO_DIFFERS = {
    programs.key_error_fallback: "Dynamo does not guard the except path on a key added to the dict later",
    programs.is_leaf_branch: "Dynamo does not guard x.is_leaf",
    programs.backward_hook_between_calls: "Dynamo does not guard backward hooks registered between calls",
    more.prints_an_item: "Dynamo raises formatting an item() with ':.3f' (InternalTorchDynamoError)",
    more.no_grad_inner_function_under_a_flag: "Dynamo keeps grad mode on under set_grad_enabled(False) here",
}
#: Programs thunder_rs.jit refuses, naming the line (``test_refused_by_jit_naming_the_line``).
JIT_REFUSES = {programs.backward_hook_between_calls}
#: Graphs the backend runs eagerly, with a warning: a torch.func transform's state changes.
EAGER_GRAPHS = {programs.func_grad_inside, programs.jacrev_inside}


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
        if not (compile_it is _compile and program in EAGER_GRAPHS):
            warnings.filterwarnings("error", message="thunder_rs backend")  # no graph runs eagerly
        _assert_same(program(compile_it), expected)


def test_is_compiling_is_true_under_jit_as_under_torch_compile():
    # Documented: thunder_rs answers is_compiling() as torch.compile does, not as eager.
    eager = programs.is_compiling_branch(_eager)
    torch._dynamo.reset()
    compiled = programs.is_compiling_branch(_compile)
    _assert_same(programs.is_compiling_branch(thunder_rs.jit), compiled)
    _assert_same(compiled, [torch.full((2,), 6.0)] * 2)
    _assert_same(eager, [torch.full((2,), 4.0)] * 2)


def test_a_tensor_requiring_grad_printed_shows_the_node_it_has():
    # The values printed are the call's; grad_fn is the compiled call's node (as under torch.compile).
    got, expected = (
        more.prints_a_tensor_requiring_grad(thunder_rs.jit),
        more.prints_a_tensor_requiring_grad(_eager),
    )
    _assert_same(got[::2], expected[::2])
    assert [t.replace("CompiledFunctionBackward", "MmBackward0") for t in got[1::2]] == expected[1::2]


# -- what differed --------------------------------------------------------------------------------


def _scaled_by_its_attribute(x):
    return x * _scaled_by_its_attribute.scale


def _remembers_its_last_size(x):
    _remembers_its_last_size.last = x.shape[0]
    return x * 2


@COMPILERS
def test_an_attribute_of_a_function_changed_between_calls_is_read_again(compile_it):
    # Kept the first call's scale, silently: nothing guarded what a function held as attributes.
    run, seen = compile_it(_scaled_by_its_attribute), []
    for scale in (2.0, 3.0, 2.0):
        _scaled_by_its_attribute.scale = scale
        seen.append(run(torch.ones(2)))
    _assert_same(seen, [torch.full((2,), s) for s in (2.0, 3.0, 2.0)])
    if compile_it is thunder_rs.jit:
        assert thunder_rs.cache_misses(run) == 2


@COMPILERS
@pytest.mark.parametrize("holder", more.FUNCTION_HOLDERS, ids=[h.__name__[1:] for h in more.FUNCTION_HOLDERS])
def test_an_attribute_of_a_function_reached_through_a_hook_partial_or_container_is_read_again(holder, compile_it):
    # Kept the first call's value, silently: a forward hook's gain, a partial's function's scale,
    # a function in a dict or in a list read by a computed index.
    expected = more.function_attribute_changed(_eager, holder)
    torch._dynamo.reset()
    _assert_same(more.function_attribute_changed(compile_it, holder), expected)


def test_a_counter_a_decorator_keeps_on_its_wrapper_counts_every_call():
    # Counted the traced call alone (1 where eager counts 3), the output scaled by it too.
    programs._scaled_by_calls.calls = 0
    run = thunder_rs.jit(lambda x: programs._scaled_by_calls(x).sum())
    _assert_same([run(torch.ones(2)) for _ in range(3)], [torch.tensor(4.0 * n) for n in (1, 2, 3)])
    assert programs._scaled_by_calls.calls == 3
    assert thunder_rs.cache_misses(run) == 3  # (each call finds the count of the last: as a global object's)


def test_an_attribute_a_function_sets_on_itself_is_set_by_every_call():
    run = thunder_rs.jit(_remembers_its_last_size)
    for n in (2, 3, 5):
        run(torch.ones(n))
        assert _remembers_its_last_size.last == n and type(_remembers_its_last_size.last) is int


class _ByComputedName(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.which = 1.0, 2.0, "a"

    def forward(self, x):
        return x * getattr(self, self.which)


class _ByVars(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Identity()
        self.inner.scale = 1.0

    def forward(self, x):
        return x * vars(self.inner)["scale"]


@COMPILERS
def test_a_module_attribute_read_by_a_computed_name_changed_between_calls_is_read_again(compile_it):
    # The __getattr__ wrapper kept the first call's temperature, silently (getattr_delegation).
    for make, changes in [
        (_ByComputedName, [("which", "b"), ("b", 5.0), ("which", "a")]),
        (_ByVars, [("scale", 3.0), ("scale", 0.5)]),
    ]:
        model = make()
        run, holder = compile_it(model), getattr(model, "inner", model)
        seen, expected = [run(torch.ones(1))], [model(torch.ones(1))]
        for name, value in changes:
            setattr(holder, name, value)
            seen.append(run(torch.ones(1)))
            expected.append(model(torch.ones(1)))
        _assert_same(seen, expected)


class _Masked(nn.Module):
    def __init__(self):
        super().__init__()
        self.mask = torch.ones(2)


class _Delegates(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner, self.which = _Masked(), "mask"
        self.last = torch.zeros(())

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.inner, name)

    def forward(self, x):
        self.last = x.sum()  # (a new tensor set by every call)
        return x * self.mask


def test_a_tensor_a_wrapper_delegates_to_replaced_between_calls_is_read_again():
    # Kept the first call's mask, silently (``getattr(self.inner, name)`` guarded nothing).
    model = _Delegates()
    run, seen, expected = thunder_rs.jit(model), [], []
    for mask in (torch.ones(2), torch.full((2,), 3.0), torch.full((2,), 3.0)):
        model.inner.mask = mask
        seen.append(run(torch.ones(2)))
        expected.append(model(torch.ones(2)))
    _assert_same(seen, expected)
    assert thunder_rs.cache_misses(run) == 1  # (the mask is read where it is by every call)


class _DelegatesAndCounts(_Delegates):
    def __init__(self):
        super().__init__()
        self.steps = 0

    def forward(self, x):
        self.steps += 1
        self.last = x.sum()
        return x * getattr(self, self.which)


def test_a_tensor_a_module_sets_every_call_next_to_a_read_by_a_computed_name_does_not_recompile():
    # With all of its attributes guarded by identity, ``self.last`` (a new tensor each call)
    # compiled every call: a tensor the trace does not take is guarded on its metadata.
    model = _DelegatesAndCounts()
    run = thunder_rs.jit(model)
    for i in range(6):
        _assert_same(run(torch.full((2,), float(i))), torch.full((2,), float(i)))
        assert model.last.item() == 2 * i and model.steps == i + 1
    assert thunder_rs.cache_misses(run) == 3  # (the first call, steps 1, then steps symbolic)


# -- refused --------------------------------------------------------------------------------------


def _line_of(code, marker: str) -> str:
    code = inspect.unwrap(code)  # (a decorated helper: its own file and lines)
    lines, first = inspect.getsourcelines(code)
    return f"{inspect.getsourcefile(code)}:{first + next(i for i, line in enumerate(lines) if marker in line)}"


REFUSED = [
    (programs.global_counter, programs._counts_globally, "CALLS += 1", "global 'CALLS'"),
    (programs.mutable_default_argument, programs._appends_to_default, "history=[]", "__defaults__"),
    (more.enable_grad_decorated_helper, more._energy_grad, "autograd.grad", "torch.autograd.grad"),
    (programs.backward_hook_between_calls, programs.backward_hook_between_calls, "out = run(", "backward hooks"),
]
REFUSED_IDS = ["global_counter", "mutable_default", "autograd_grad_inside", "backward_hook"]


@pytest.mark.parametrize("program, code, marker, what", REFUSED, ids=REFUSED_IDS)
def test_refused_by_jit_naming_the_line(program, code, marker, what):
    line = _line_of(code, marker)
    with pytest.raises(ThunderNotImplementedError, match=rf"(?s)(?=.*{what})(?=.*{line}\b)"):
        program(thunder_rs.jit)


@pytest.mark.parametrize("program", [r[0] for r in REFUSED[:3]], ids=REFUSED_IDS[:3])
def test_under_torch_compile_they_run_as_eager(program):
    expected = program(_eager)
    torch._dynamo.reset()
    _assert_same(program(_compile), expected)
