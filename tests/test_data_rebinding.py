"""``p.data = v`` inside a compiled program gives ``p`` ``v``'s memory, as eager does, over several calls.

What differed: the compiled call copied the value into ``p``'s old memory, so a tensor sharing it
(``old = p.detach()`` taken before the call) saw the new values, ``p`` did not share memory with
``v`` afterwards (a write to a returned ``v`` did not reach ``p``), a value the caller holds
(``p.data = held``) or another parameter's memory (``k.weight.data = q.weight.data``) was
refused, and a value written in place after the assignment (``p.data = v; v.add_(1)``) left ``p``
with the values before that write. The call now gives the caller's tensor the value's memory by
``.data =`` (``writeback.WriteBacks.rebinds``); what a trace cannot make (a write after
the assignment, a view's ``.data``) is refused naming the line, and under ``torch.compile`` that
graph runs eagerly. (Other sizes or another dtype run: ``test_refusals_round2``.)"""

import inspect
import re
import warnings

import pytest
import torch
from torch import nn

import thunder_rs
from test_dynamo_backend import compiled_by_thunder_rs, fresh_dynamo  # noqa: F401 (a fixture)
from thunder_rs.errors import ThunderNotImplementedError

pytestmark = pytest.mark.usefixtures("one_thread")


def _eager(fn):
    return fn


def _compile(fn):
    return torch.compile(fn, backend="thunder_rs")


COMPILERS = pytest.mark.parametrize("compile_it", [thunder_rs.jit, _compile], ids=["jit", "torch_compile"])


def _line_of(fn, marker: str) -> str:
    lines, first = inspect.getsourcelines(fn)
    return f"{fn.__code__.co_filename}:{first + next(i for i, line in enumerate(lines) if marker in line)}"


def _momentum_encoder(compile_it) -> list:
    """A key encoder moved towards the query one through ``.data``; what each call leaves: the
    values, the old memory's values, which memory ``k``'s weight uses, and a write to the returned
    value after the call."""
    torch.manual_seed(0)
    query, key = nn.Linear(4, 3), nn.Linear(4, 3)
    key.load_state_dict(query.state_dict())
    weight, bias = key.weight, key.bias
    optimizer = torch.optim.SGD(list(query.parameters()) + list(key.parameters()), lr=0.1, momentum=0.9)

    def step(x):
        out = query(x).sum() + key(x).sum()
        new = key.weight.data * 0.9 + query.weight.data * 0.1
        key.weight.data = new
        key.bias.data = key.bias.data * 0.9 + query.bias.data * 0.1
        return out, new

    run, seen = compile_it(step), []
    for i in range(3):
        old = key.weight.detach()
        out, new = run(torch.ones(2, 4) * i)
        assert key.weight is weight and key.bias is bias and key.weight.requires_grad
        seen += [out, old.clone(), key.weight.detach().clone(), key.bias.detach().clone()]
        seen += [key.weight.data_ptr() == new.data_ptr(), key.weight.data_ptr() == old.data_ptr()]
        out.backward()
        optimizer.step()  # (its momentum buffers are keyed by the parameters themselves)
        optimizer.zero_grad()
        new.add_(1)  # written after the call: eager's key weight is this memory
        seen += [key.weight.detach().clone(), [s["momentum_buffer"].clone() for s in optimizer.state.values()]]
    if compile_it is thunder_rs.jit:
        assert thunder_rs.cache_misses(run) == 1 and thunder_rs.cache_hits(run) == 2
    return seen


def _same(got, expected) -> None:
    if isinstance(expected, torch.Tensor):
        assert got.dtype == expected.dtype and got.shape == expected.shape
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
    elif isinstance(expected, (list, tuple)):
        assert len(got) == len(expected)
        for a, b in zip(got, expected):
            _same(a, b)
    else:
        assert got == expected


@COMPILERS
def test_assigning_data_gives_the_parameter_the_values_memory_as_eager(compile_it):
    # The old memory took the new values, and the returned value's later write did not reach the key.
    expected = _momentum_encoder(_eager)
    torch._dynamo.reset()
    _same(_momentum_encoder(compile_it), expected)
    if compile_it is _compile:
        assert compiled_by_thunder_rs()


def _tie_and_hold(compile_it) -> list:
    torch.manual_seed(0)
    first, second = nn.Linear(3, 3), nn.Linear(3, 3)
    held = torch.randn(3)

    def tie(x):
        second.weight.data = first.weight.data
        second.bias.data = held
        return second(x)

    run, seen = compile_it(tie), []
    for i in range(3):
        out = run(torch.ones(2, 3) * i)
        with torch.no_grad():
            first.weight.mul_(2)  # written after the call: eager's second weight is this memory
            held.add_(1)
        seen += [out, second.weight.detach().clone(), second.bias.detach().clone()]
        seen += [second.weight.data_ptr() == first.weight.data_ptr(), second.bias.data_ptr() == held.data_ptr()]
    return seen


def test_a_parameter_given_another_tensors_memory_shares_it_as_eager():
    # Refused: the value was an input of the trace, whose memory the copy could not share.
    _same(_tie_and_hold(thunder_rs.jit), _tie_and_hold(_eager))


def _old_view_read(compile_it) -> list:
    torch.manual_seed(0)
    model = nn.Linear(3, 3)

    def halve(x):
        old = model.weight.detach()
        model.weight.data = model.weight.data / 2
        return old * 1, model(x)

    run = compile_it(halve)
    return [run(torch.ones(2, 3) * i) for i in range(3)] + [model.weight.detach().clone()]


def test_a_view_taken_before_the_assignment_keeps_the_old_values_as_eager():
    # Read the new values: the copy into the tensor's old memory recomputed its live views.
    _same(_old_view_read(thunder_rs.jit), _old_view_read(_eager))


def written_after(model, x):
    new = model.weight.data * 2
    model.weight.data = new  # assigned
    new.add_(1)
    return model(x)


def changes_dtype(model, x):
    model.weight.data = model.weight.data.half()  # assigned
    return x * 2


def changes_size(model, x):
    model.bias.data = torch.zeros(5)  # assigned
    return x * 2


def writes_the_old_memory(model, x):
    old = model.weight.detach()
    model.weight.data = model.weight.data * 2  # assigned
    old.add_(1)
    return model(x)


def through_a_view(model, x):
    model.weight[0].data = torch.zeros(3)  # assigned
    return model(x)


REFUSED = pytest.mark.parametrize(
    "program, why",
    [
        (written_after, r"written in place \(or given other memory\) after"),
        (through_a_view, "is a view of another"),
    ],
    ids=["written_after", "view"],
)


@REFUSED
def test_what_a_trace_cannot_rebind_is_refused_naming_the_line(program, why):
    # written_after: the key kept the values before the write, silently.
    model = nn.Linear(3, 3)
    weight = model.weight.detach().clone()
    line = _line_of(program, "# assigned")
    with pytest.raises(ThunderNotImplementedError, match=rf"Tensor.data = value at {line}: .*{why}"):
        thunder_rs.jit(program)(model, torch.randn(2, 3))
    assert torch.equal(model.weight.detach(), weight)


@pytest.mark.parametrize(
    "program", [written_after, changes_dtype, changes_size], ids=["written_after", "dtype", "size"]
)
def test_what_a_trace_cannot_rebind_runs_eagerly_under_torch_compile(program):
    def runs(compile_it):
        torch.manual_seed(0)
        model, seen = nn.Linear(3, 3), []
        run = compile_it(lambda x: program(model, x))
        for i in range(2):
            old = model.weight.detach()
            out = run(torch.ones(2, 3) * i)
            seen += [out.detach(), old.clone(), model.weight.detach().clone(), model.bias.detach().clone()]
        return seen

    expected = runs(_eager)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _same(runs(_compile), expected)
    if program is written_after:  # (Dynamo itself breaks the graph at a dtype's or a size's change)
        line = _line_of(program, "# assigned")
        assert any(re.search(rf"runs eagerly: .*Tensor.data = value at {line}\b", str(w.message)) for w in caught)


def test_a_write_to_the_memory_given_up_is_refused_naming_both_lines():
    # Wrote the values into the tensor's new memory: the view followed the tensor.
    model = nn.Linear(3, 3)
    assigned, written = _line_of(writes_the_old_memory, "# assigned"), _line_of(writes_the_old_memory, "old.add_")
    with pytest.raises(ThunderNotImplementedError, match=rf"add_ at {written}: .*Tensor.data = value at {assigned}\b"):
        thunder_rs.jit(writes_the_old_memory)(model, torch.randn(2, 3))
