"""Compile costs cut in stop 65 (benchmarks/results/compile_costs_stop65.md), each pinned by what
it no longer does, with the program's outputs against eager's."""

import contextlib
import inspect
import json.decoder
import sys

import pytest
import torch
import torch.nn as nn

import thunder_rs
import user_programs_round14_python as round14
from thunder_rs.core.base import userframe

pytestmark = pytest.mark.usefixtures("one_thread")

# -- which of the program's frames run inside a try body (``userframe.handling_frame``) ------------


class _Guarded(nn.Module):
    """An embedding call inside a ``with`` block and a ``try`` with only ``finally``, then one in a
    ``try`` with a bare ``except:``, which catches an id past the vocabulary."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(5, 3)
        self.closed = 0

    def forward(self, ids, other):
        with torch.enable_grad():
            try:
                e = self.emb(other)
            finally:
                self.closed += 1
        try:
            e = e + self.emb(ids)
        except:  # noqa: E722 (the bare clause is what is tested)
            e = e - 1
        return e


def _with_and_finally(emb, ids):
    with torch.enable_grad():
        try:
            return emb(ids)
        finally:
            pass


def test_a_with_block_and_a_try_without_except_parse_no_source(monkeypatch):
    # Whether a frame's line is in a try body with except clauses is found by parsing its
    # function (18 ms of the HF GPT-2 compile: transformers' wrappers and masks, which only have
    # ``with`` blocks and ``finally``). Their bytecode has no except clause's opcodes: no parse.
    parsed = []
    function_node = userframe._function_node
    monkeypatch.setattr(userframe, "_function_node", lambda code: parsed.append(code) or function_node(code))
    emb = nn.Embedding(5, 3)
    run = thunder_rs.jit(_with_and_finally)
    for ids in ([1, 2], [4, 0]):
        assert torch.equal(run(emb, torch.tensor(ids)), _with_and_finally(emb, torch.tensor(ids)))
    assert _with_and_finally.__code__ not in parsed
    assert not userframe._handles_exceptions(_with_and_finally.__code__)


def test_a_bare_except_clause_is_still_found():
    # (a bare ``except:`` names no class: no CHECK_EXC_MATCH, its handler pops the exception)
    torch.manual_seed(0)
    model = _Guarded()
    run = thunder_rs.jit(model)
    for ids in ([1, 2], [1, 7], [0, 4], [9, 9]):
        other = torch.tensor([3, 1])
        got, expected = run(torch.tensor(ids), other), model(torch.tensor(ids), other)
        assert torch.equal(got, expected)
    assert model.closed == 8


def _functions(module):
    codes = [f.__code__ for f in vars(module).values() if inspect.isfunction(f)]
    codes += [c for f in vars(module).values() if inspect.isclass(f) for c in _method_codes(f)]
    return codes + [c for code in list(codes) for c in code.co_consts if inspect.iscode(c)]


def _method_codes(cls):
    return [f.__code__ for f in vars(cls).values() if inspect.isfunction(f) and f.__module__ == cls.__module__]


def test_the_bytecode_finds_every_function_with_a_try_body_its_source_has():
    # (where the bytecode says no except clause, the function's own syntax tree has no try
    # statement with handlers: over stdlib's, torch's, transformers' and the test programs' code)
    import transformers.masking_utils
    import transformers.utils.generic

    modules = (json.decoder, contextlib, round14, sys.modules[__name__], torch.nn.modules.module)
    modules += (transformers.utils.generic, transformers.masking_utils)
    found = skipped = 0
    for code in (c for m in modules for c in _functions(m)):
        if userframe._parsed_try_bodies(code):
            assert userframe._handles_exceptions(code), code
            found += 1
        skipped += not userframe._handles_exceptions(code) and bool(getattr(code, "co_exceptiontable", b""))
    assert found > 10 and (skipped > 10 or sys.version_info < (3, 11))


# -- the whole backward of a call with several differentiable outputs -------------------------------


def _loss_and_logits(w, x, y):
    logits = torch.tanh(x @ w)
    return torch.nn.functional.cross_entropy(logits, y), logits


def _inputs():
    torch.manual_seed(0)
    return torch.randn(4, 3, requires_grad=True), torch.randn(5, 4), torch.tensor([0, 2, 1, 2, 0])


@pytest.mark.parametrize("both", [False, True], ids=["loss_only", "loss_and_logits"])
def test_the_whole_backward_is_compiled_where_a_backward_runs_it(monkeypatch, both):
    # ``loss.backward()`` of a call returning the loss and its logits runs the backward compiled
    # for the logits' absent cotangent; the whole backward (4 ms of compile() for a GPT-2's
    # source) was compiled with the forward and never ran. It is compiled at its first call. The
    # gradients are eager's, from the loss alone and from both.
    from thunder_rs.core.run import codes, generate

    loaded = []
    program = codes.program
    monkeypatch.setattr(generate.codes, "program", lambda s, f: loaded.append(f) or program(s, f))
    w, x, y = _inputs()
    run = thunder_rs.jit(_loss_and_logits)
    got, expected = [], []
    for fn, grads in ((run, got), (_loss_and_logits, expected)):
        loss, logits = fn(w, x, y)
        (loss + logits.sum() if both else loss).backward()
        grads.append(w.grad)
        w.grad = None
    assert torch.equal(got[0], expected[0])
    backwards = [f for f in loaded if f.endswith(" backward")]
    assert len(backwards) == 1, backwards
    loss, logits = run(w, x, y)
    (loss + logits.sum() if not both else loss).backward()  # (the other pattern: its own backward)
    assert len([f for f in loaded if f.endswith(" backward")]) == 2


# -- whether a guard's value changes in place, per builtin class ------------------------------------


def test_whether_a_builtin_value_changes_in_place_is_found_once_per_class(monkeypatch):
    # (each answer ran ``isinstance`` against the ABCs of ``items.MUTABLE``: ABCMeta's Python)
    from thunder_rs.core.state import items

    looked = []
    wrapped = items.wrapped
    monkeypatch.setattr(items, "wrapped", lambda v: looked.append(v) or wrapped(v))
    values = [_inputs, _loss_and_logits, test_a_bare_except_clause_is_still_found, print, len]
    assert [items.changes_in_place(v) for v in values] == [False] * 5
    containers = ([1], {2: 3}, {4}, (5,), "6", 7.0)
    assert [items.changes_in_place(v) for v in containers] == [True, True, True, False, False, False]
    assert len(looked) <= 3  # (a Python function, a builtin one, a tuple: once each)


def test_a_class_registered_with_an_abc_of_the_mutable_containers_changes_in_place():
    # (``UserDict.register(int)`` makes ints instances of it, as ``isinstance`` answers: the
    # answers kept per class are dropped when an ABC registers a class)
    import collections

    from thunder_rs.core.state import items

    assert not items.changes_in_place(3)
    collections.UserList.register(int)
    try:
        assert isinstance(3, collections.UserList) and items.changes_in_place(3)
    finally:
        collections.UserList._abc_registry_clear()  # (a debugging aid no program has: no new token)
        collections.UserList._abc_caches_clear()
        items._ANSWERS.clear()
    assert not isinstance(3, collections.UserList) and not items.changes_in_place(3)


_TABLE = {"scale": 2.0}


def _scaled(x):
    return x * _TABLE["scale"]


def test_a_global_dict_changed_in_place_between_calls_gives_eagers_output():
    run = thunder_rs.jit(_scaled)
    x = torch.randn(3)
    for scale in (2.0, 3.0, 0.5):
        _TABLE["scale"] = scale
        assert torch.equal(run(x), _scaled(x))
    _TABLE["scale"] = 2.0


# -- a proxy's metadata ------------------------------------------------------------------------------


def test_a_proxys_shape_dtype_and_device_are_read_without_a_python_frame():
    # (read thousands of times a compile: a property whose getter is Python runs a frame each)
    from thunder_rs.core.base.proxies import make_proxy
    from thunder_rs.core.base.dtypes import CODES

    proxy = make_proxy(0, (2, 3), CODES[torch.float16], "cpu", False)
    frames = []
    sys.setprofile(lambda frame, event, arg: frames.append(frame.f_code.co_name) if event == "call" else None)
    try:
        read = (proxy.shape, proxy.dtype, proxy.device)
    finally:
        sys.setprofile(None)
    assert read == (torch.Size([2, 3]), torch.float16, torch.device("cpu")) and frames == []


# -- ``len`` while a program is traced ------------------------------------------------------------


def test_len_of_a_list_or_a_shape_while_tracing_asks_no_isinstance(monkeypatch):
    # (``builtins.len`` is ``stdlib_state._len`` while a program is traced: thousands of calls a
    # compile, most of them thunder_rs's own, each asked whether its argument is a tensor)
    from thunder_rs.core.acquisition import stdlib_state

    asked = []
    monkeypatch.setattr(stdlib_state, "isinstance", lambda *a: asked.append(a) or isinstance(*a), raising=False)
    for sized in ([1, 2], (3,), torch.Size([2, 5]), {"a": 1}, "abc"):
        assert stdlib_state._len(sized) == len(sized)
    assert asked == []


def _lengths(x, items):
    return x * len(items) + len(x), len(items)


def test_len_of_a_tensor_and_of_a_list_in_the_program_gives_eagers_answers():
    run = thunder_rs.jit(_lengths)
    for n, items in ((3, [1, 2]), (4, [1, 2, 3]), (5, (1,))):
        x = torch.randn(n, 2)
        got, expected = run(x, items), _lengths(x, items)
        assert torch.equal(got[0], expected[0]) and got[1] == expected[1]
