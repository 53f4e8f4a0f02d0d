"""Programs as users write them, round 14, each next to eager over several calls while module
state, Python state or the input data change between calls: module state (global forward hooks
and pre-hooks registered after the first call and removed, hooks ``with_kwargs`` added later, a
parameter replaced, ``requires_grad_`` toggled, a submodule swapped, the model moved to
``float64``, ``half``, ``bfloat16`` and to channels-last, a conv and batch norm fused, pruning and the old weight norm's
hooks, a parametrization registered after compiling, ``load_state_dict`` with ``assign=True``,
one submodule in ``eval()``, a buffer re-registered, weights tied after the first call, anomaly
mode read by the model, ``model.apply`` changing settings), Python constructs (``try``/``except``
around a factorisation or an embedding that fails on some inputs, a generator driven by
``send``, one closed early with a ``finally``, one holding ``no_grad`` open while suspended,
closures and partials whose captured values change, ``match`` on a config, an ``ExitStack`` of
context managers with side effects, an ``nn.Parameter`` subclass, a forward replaced by
``types.MethodType``, ``NamedTuple`` and dataclass inputs, dicts whose keys and order change)
and data-dependent model code (top-k / top-p sampling from a ``torch.Generator`` passed in,
``unique``, ``unique_consecutive``, ``histc``, ``bucketize`` and ``bincount`` counts as sizes,
``repeat_interleave`` by a tensor and a ragged split by ``lengths.tolist()``). Outputs,
gradients, state left behind and errors are compared with eager. The programs sit in
``user_programs_round14*.py``.

What differed: a call that raises on some values (``torch.linalg.cholesky`` of a matrix that is not
positive definite, an embedding of an id past the vocabulary, indexing by an integer tensor past
the end, ``one_hot`` past ``num_classes``, ``bincount`` of a negative value) inside the program's ``try`` block
raised out of the compiled call, traced where it succeeded, instead of running the program's
``except`` clause as eager does (and, traced where it raised, ran the except clause on every
call). Whether it raises is now a read of the call's values (``ValueReads.raised``, for the calls
in ``langctx.RAISE_ON_VALUES`` made in a ``try`` body of the program: ``userframe.handling_frame``):
each compiled call checks it, and the variant for the other outcome runs there.

A forward that sets ``requires_grad_`` of its own parameters stays refused, naming the line.
Dynamo itself (``backend="eager"`` too) keeps a graph traced before a global module hook or a
submodule's hook was registered, and raises the call's error where eager's ``except`` clause
runs: left to it."""

import ast
import inspect

import pytest
import torch

import thunder_rs
import user_programs_round14 as programs
import user_programs_round14_python as python
from test_dynamo_backend import compiled_by_thunder_rs, fresh_dynamo  # noqa: F401 (a fixture)
from test_user_programs_round7 import _compile, _eager
from test_user_programs_round11 import _assert_same
from test_user_programs_round12 import _line

pytestmark = pytest.mark.usefixtures("one_thread")

PROGRAMS = [
    programs.global_forward_hook_added_and_removed,
    programs.global_forward_pre_hook_added_and_removed,
    programs.pre_hook_with_kwargs_added_later,
    programs.parameter_replaced_between_calls,
    programs.requires_grad_toggled,
    programs.submodule_swapped,
    programs.moved_to_other_dtypes,
    programs.parametrization_registered_after_compile,
    programs.load_state_dict_assigned,
    programs.eval_of_one_submodule,
    programs.buffer_replaced_between_calls,
    programs.weights_tied_after_the_first_call,
    programs.anomaly_mode_read_by_the_model,
    programs.apply_changes_submodule_settings,
    programs.forward_hook_with_kwargs_added_later,
    programs.channels_last_then_fused_conv_bn,
    programs.pruned_after_the_first_call,
    python.cholesky_failure_falls_back,
    python.embedding_out_of_vocabulary_falls_back,
    python.index_one_hot_and_bincount_failing_in_try,
    python.generator_driven_by_send,
    python.closures_and_partials_changed,
    python.match_on_a_config,
    python.exit_stack_of_side_effects,
    python.parameter_subclass,
    python.forward_replaced_by_method_type,
    python.namedtuple_and_changing_dict_keys,
    python.top_k_top_p_sampling_from_a_generator,
    python.unique_and_histc_counts_as_sizes,
    python.repeat_interleave_and_ragged_split,
    python.dict_keys_changing_order,
    python.dataclass_input_written_and_changing_keywords,
    python.generator_closed_early,
    python.no_grad_held_open_by_a_suspended_generator,
    python.consecutive_runs_and_buckets,
]
#: Programs Dynamo itself runs otherwise than eager (``backend="eager"`` too): left to it.
DYNAMO_DIFFERS = {
    programs.global_forward_hook_added_and_removed: "Dynamo keeps the graph traced before the global hook",
    programs.global_forward_pre_hook_added_and_removed: "Dynamo keeps the graph traced before the global pre-hook",
    programs.forward_hook_with_kwargs_added_later: "Dynamo keeps the graph traced before the submodule's hook",
    python.cholesky_failure_falls_back: "Dynamo raises LinAlgError where eager's except clause runs",
    python.embedding_out_of_vocabulary_falls_back: "Dynamo raises IndexError where eager's except clause runs",
    python.index_one_hot_and_bincount_failing_in_try: "Dynamo raises IndexError where eager's except clause runs",
}
#: Under torch.compile in the default run: one of each kind; the others are marked slow.
COMPILED_BY_DEFAULT = {
    programs.parameter_replaced_between_calls,
    programs.parametrization_registered_after_compile,
    python.match_on_a_config,
    python.exit_stack_of_side_effects,
    python.repeat_interleave_and_ragged_split,
}


def _cases() -> list:
    cases = [pytest.param(p, thunder_rs.jit, id=f"{p.__name__}-jit") for p in PROGRAMS]
    for p in PROGRAMS:
        slow = () if p in COMPILED_BY_DEFAULT else (pytest.mark.slow,)
        cases.append(pytest.param(p, _compile, id=f"{p.__name__}-torch_compile", marks=slow))
    return cases


@pytest.mark.filterwarnings("ignore:thunder_rs.*recompiled", "ignore:.*weight_norm")
@pytest.mark.parametrize("program, compile_it", _cases())
def test_a_program_over_several_calls_is_eagers(program, compile_it):
    if compile_it is _compile and program in DYNAMO_DIFFERS:
        pytest.skip(DYNAMO_DIFFERS[program])
    expected = program(_eager)
    torch._dynamo.reset()
    _assert_same(program(compile_it), expected)


# -- a call that raises on some values, inside the program's try block ------------------------------


def _eye(scale: float):
    return torch.eye(3, dtype=torch.float64) * scale


@pytest.mark.parametrize("first", [2.0, -2.0], ids=["succeeds_first", "raises_first"])
def test_a_factorisation_failing_inside_a_try_block_runs_the_except_clause_as_eager(first):
    # Raised LinAlgError out of the compiled call (traced where it succeeded), or ran the except
    # clause on every call (traced where it raised), where eager's call takes the other branch.
    run, b = thunder_rs.jit(python._whitened), torch.ones(3, 1, dtype=torch.float64)
    for scale in (first, -first, first, -first):
        got, expected = run(_eye(scale), b), python._whitened(_eye(scale), b)
        assert got[1] == expected[1]
        assert torch.equal(got[0], expected[0])
    assert thunder_rs.cache_misses(run) == 2
    assert "LinAlgError" in thunder_rs.compile_stats(run).miss_reasons[-1]


def _factor_helper(a):
    return torch.linalg.cholesky(a)


class _Factored(torch.nn.Module):
    def forward(self, a):
        try:
            return _factor_helper(a), True  # (the call is in a helper: the try is the caller's)
        except RuntimeError:
            return torch.zeros_like(a), False


def test_a_try_block_of_a_calling_frame_is_found():
    run = thunder_rs.jit(_Factored())
    for scale in (1.0, -1.0, 1.0):
        got, expected = run(_eye(scale)), _Factored()(_eye(scale))
        assert got[1] == expected[1] and torch.equal(got[0], expected[0])


def test_a_failing_factorisation_outside_a_try_block_raises_as_eager():
    run = thunder_rs.jit(_factor_helper)
    run(_eye(1.0))
    with pytest.raises(torch.linalg.LinAlgError, match="not positive-definite"):
        run(_eye(-1.0))
    assert "check_value" not in str(thunder_rs.last_traces(run)[-1])  # (no read made outside a try)


@pytest.mark.parametrize(
    ("function", "args"),
    [
        (torch.nn.functional.embedding, (torch.tensor([0, 1]), torch.randn(4))),  # (a Python function of torch's)
        (torch.linalg.cholesky, (torch.randn(3, 4),)),  # (a builtin: no frame of its own)
    ],
    ids=["embedding", "cholesky"],
)
def test_a_try_block_around_the_call_of_a_jitted_torch_function_is_not_the_programs(function, args):
    # (the program is torch's: the caller's try is not in the program, whose check stays
    # thunder_rs's, naming the op; the try of a test harness had made them eager's errors)
    run = thunder_rs.jit(function)
    try:
        run(*args)
    except RuntimeError as error:
        raised = error
    assert isinstance(raised, thunder_rs.errors.ThunderError), repr(raised)
    assert not any("check_value" in str(trace) for trace in thunder_rs.last_traces(run))


def test_on_inputs_without_data_a_call_in_a_try_block_is_traced_as_before():
    # (no value to read: eager's call on meta tensors raises nothing either)
    a, b = (torch.empty(*shape, dtype=torch.float64, device="meta") for shape in ((3, 3), (3, 1)))
    out, route = thunder_rs.jit(python._whitened)(a, b)
    assert out.is_meta and out.shape == (3, 1) and route == 0


# -- requires_grad_ of its own parameters set by a forward -------------------------------------------


def test_a_forward_setting_requires_grad_of_its_parameters_is_refused_naming_the_line():
    model = programs.FrozenInside()
    with pytest.raises(thunder_rs.errors.ThunderNotImplementedError, match="requires_grad") as e:
        thunder_rs.jit(model)(torch.randn(2, 3), True)
    assert _line(programs.FrozenInside.forward, "requires_grad_(False)") in str(e.value)
    assert all(p.requires_grad for p in model.parameters())


def test_a_functions_try_bodies_parsed_alone_are_those_of_its_files_tree():
    # (handling_frame parses a function's own lines, not its whole file: the same line ranges)
    import contextlib
    import json

    from thunder_rs.core.base import userframe

    codes = [
        f.__code__
        for module in (python, programs, json.decoder, contextlib)
        for f in vars(module).values()
        if inspect.isfunction(f) and f.__code__.co_name != "<lambda>"
    ]
    codes += [c for c in list(codes) for c in c.co_consts if inspect.iscode(c) and c.co_name != "<lambda>"]
    with_tries = 0
    for code in codes:
        alone, shift = userframe._function_node(code)
        tree = userframe._parsed(code.co_filename)
        defs = [
            fn
            for fn in ast.walk(tree)
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
            and userframe._first_line(fn) == code.co_firstlineno
        ]
        if not defs:  # (a class body, a comprehension: no function of its own)
            assert alone is None, code
            continue
        whole = defs[0]
        ranges = [
            [
                (t.body[0].lineno + s, t.body[-1].end_lineno + s)
                for t in userframe._own_nodes(fn)
                if isinstance(t, ast.Try)
            ]
            for fn, s in ((alone, shift), (whole, 0))
        ]
        assert ranges[0] == ranges[1], code
        with_tries += bool(ranges[0])
    assert with_tries >= 3
