"""Lists and dicts passed as arguments that the program changes, next to eager over several calls.

What differed: a program changing a list, dict or ``defaultdict`` it was given (``metrics["loss"]
= loss``, ``losses.append(loss)``, ``d.setdefault(k, [])``, ``del d[k]``, ``lst[i] = t``) was
refused, as tracing runs it on the copies torch's pytree makes of them; every call now makes the
changes on the caller's containers, as eager does (``core.acquisition.argument_containers``).
"""

import collections
import dataclasses
import inspect
import types

import pytest

import torch

import thunder_rs
from thunder_rs.errors import ThunderNotImplementedError


def _assert_same(a, b) -> None:
    """``a`` and ``b`` hold equal items: tensors bit-equal, with equal ``requires_grad``."""
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b) and a.requires_grad == b.requires_grad and a.dtype == b.dtype
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same(x, y)
    else:
        assert a == b


def _train_step(x, w, metrics, losses):
    loss = (x @ w).pow(2).mean()
    metrics["loss"] = loss.detach()
    metrics["steps"] = metrics.get("steps", 0) + 1
    metrics.setdefault("first", loss.detach())
    losses.append(loss.detach())
    return loss


def test_a_training_loops_metrics_dict_and_list_of_losses_are_changed_as_eager():
    # Refused: "the traced program changed a list or dict it was given as an argument".
    jf, w = thunder_rs.jit(_train_step), torch.randn(3, 2)
    metrics, losses, eager_metrics, eager_losses = {}, [], {}, []
    for _ in range(4):
        x = torch.randn(4, 3)
        _assert_same(jf(x, w, metrics, losses), _train_step(x, w, eager_metrics, eager_losses))
        _assert_same(metrics, eager_metrics)
        _assert_same(losses, eager_losses)
    assert metrics["steps"] == 4 and len(losses) == 4


def _logs_loss(x, w, metrics):
    loss = (x * w).sum()
    metrics["loss"] = loss
    return loss * 2


def test_a_loss_stored_in_a_metrics_dict_keeps_its_graph_as_eager():
    w, eager_w = torch.randn(3, requires_grad=True), torch.randn(3)
    eager_w = w.detach().clone().requires_grad_()
    x, metrics, eager = torch.randn(3), {}, {}
    _assert_same(thunder_rs.jit(_logs_loss)(x, w, metrics).detach(), _logs_loss(x, eager_w, eager).detach())
    assert metrics["loss"].requires_grad and metrics["loss"].grad_fn is not None
    metrics["loss"].backward()
    eager["loss"].backward()
    assert torch.equal(w.grad, eager_w.grad)


def _set_item(x, metrics):
    metrics["aux"] = (x * 2).sum()
    return x + 1


def _append(x, cache):
    cache.append(x * 2)
    return x


def _pop(x, metrics):
    return metrics.pop("old", 0.0) * x


def _appends_to_stats(x, *, stats):
    stats["seen"].append(1)
    stats["sum"].append(x.sum())
    return x * len(stats["seen"])


class _Caches(torch.nn.Module):
    def forward(self, x, cache):
        cache.append(x * 2)
        return x


@pytest.mark.parametrize(
    "program, make, keyword",
    [
        (_set_item, dict, False),
        (_append, list, False),
        (_pop, lambda: {"old": 1.5, "kept": 2}, False),
        (_appends_to_stats, lambda: collections.defaultdict(list), True),
        (_Caches(), list, False),
    ],
    ids=["dict_item_set", "list_append", "dict_item_removed", "defaultdict_keyword", "module_list_argument"],
)
def test_a_container_argument_the_program_changes_is_changed_on_every_call_as_eager(program, make, keyword):
    # Each was refused, naming the argument and the line.
    jf, state, eager = thunder_rs.jit(program), make(), make()
    held = state
    for i in range(3):
        x = torch.arange(2.0) + i
        if keyword:
            _assert_same(jf(x, stats=state), program(x, stats=eager))
        else:
            _assert_same(jf(x, state), program(x, eager))
        _assert_same(state, eager)
    assert state is held and (type(state) is not collections.defaultdict or state.default_factory is list)


def _rearranges(x, d, lst):
    d["x"] = x
    d["y"] = x * 2
    del d["gone"]
    lst[0] = d["y"]
    lst[1], lst[2] = lst[2], lst[1]
    d.setdefault("hist", []).append(lst[1])
    return x


def test_items_set_removed_and_swapped_keep_eagers_objects():
    jf = thunder_rs.jit(_rearranges)
    for i in range(3):
        x, t = torch.randn(2), torch.randn(3)
        d, lst = {"gone": 1, "kept": t}, [None, t, "s"]
        eager_d, eager_lst = {"gone": 1, "kept": t}, [None, t, "s"]
        jf(x, d, lst)
        _rearranges(x, eager_d, eager_lst)
        _assert_same(d, eager_d)
        _assert_same(lst, eager_lst)
        # The argument and the tensor moved are the caller's objects, as in eager.
        assert d["x"] is x and d["kept"] is t and lst[2] is t and lst[0] is d["y"]


def _logs_into_nested(x, batch, *, log):
    batch["log"].append(x.sum())
    batch["count"] += 1
    log[0] = batch["count"]
    return x * batch["count"]


def test_a_list_nested_in_a_dict_argument_and_a_keyword_list_are_changed_as_eager():
    jf = thunder_rs.jit(_logs_into_nested)
    batch, log = {"log": [], "count": 0}, [None]
    eager_batch, eager_log = {"log": [], "count": 0}, [None]
    inner = batch["log"]
    for i in range(3):
        x = torch.randn(2)
        _assert_same(jf(x, batch, log=log), _logs_into_nested(x, eager_batch, log=eager_log))
        _assert_same(batch, eager_batch)
        _assert_same(log, eager_log)
    assert batch["log"] is inner


def _counts_keys(x, d):
    d[f"k{len(d)}"] = x.sum()
    return x * len(d)


def test_calls_with_other_keys_compile_again_and_change_the_callers_dict():
    jf = thunder_rs.jit(_counts_keys)
    for start in ({}, {"a": 1}, {}, {"a": 1, "b": 2}):
        d, eager = dict(start), dict(start)
        x = torch.randn(2)
        _assert_same(jf(x, d), _counts_keys(x, eager))
        _assert_same(d, eager)


def _stores_an_argument(x, a, b):
    a.append(b)  # stores
    return x


def _stores_an_object(x, d):
    d["o"] = object()  # stores
    return x


@pytest.mark.parametrize(
    "program, containers, what",
    [(_stores_an_argument, ([], []), "list a"), (_stores_an_object, ({},), "dict d")],
    ids=["argument_in_another", "object_made"],
)
def test_a_change_no_call_can_make_again_is_refused_naming_the_argument_and_line(program, containers, what):
    lines, first = inspect.getsourcelines(program)
    line = first + next(i for i, text in enumerate(lines) if "# stores" in text)
    with pytest.raises(ThunderNotImplementedError, match=rf"the {what} at .*writes\.py:{line}: it stored"):
        thunder_rs.jit(program)(torch.ones(2), *containers)
    assert all(c == [] or c == {} for c in containers)


def _fills_and_returns(x, d):
    d["y"] = x * 2
    d.pop("gone", None)
    return d, d["y"] + 1


def _returns_unchanged(x, options, names):
    return x * options["scale"], options, [names]


def test_a_list_or_dict_argument_returned_is_the_callers_as_eager():
    # A copy: changing the returned dict (or the one passed, after the call) left the other as it was.
    jf = thunder_rs.jit(_fills_and_returns)
    for i in range(2):
        x = torch.randn(2)
        d, eager = {"gone": 1, "kept": "k"}, {"gone": 1, "kept": "k"}
        (returned, y), (eager_returned, eager_y) = jf(x, d), _fills_and_returns(x, eager)
        _assert_same(d, eager)
        _assert_same(y, eager_y)
        assert returned is d and eager_returned is eager
    jf = thunder_rs.jit(_returns_unchanged)
    for i in range(2):
        options, names = {"scale": 2.0}, ["a"]
        y, returned, (returned_names,) = jf(torch.ones(2), options, names)
        _assert_same(y, _returns_unchanged(torch.ones(2), options, names)[0])
        assert returned is options and returned_names is names


def _writes_one_reads_other(x, a, b):
    a["n"] = 2
    return x * b.get("n", 1)


def test_one_dict_passed_twice_to_a_program_changing_one_is_refused_before_running():
    # Traced on two copies, the compiled call read 1 from b where eager reads the 2 written to a.
    jf = thunder_rs.jit(_writes_one_reads_other)
    a, b, eager_a, eager_b = {}, {}, {}, {}
    _assert_same(jf(torch.ones(2), a, b), _writes_one_reads_other(torch.ones(2), eager_a, eager_b))
    _assert_same((a, b), (eager_a, eager_b))
    d = {}
    with pytest.raises(ThunderNotImplementedError, match="dict at positional argument 2 is also passed at positional"):
        jf(torch.ones(2), d, d)
    assert d == {}


@dataclasses.dataclass
class _Step:
    loss: torch.Tensor
    log: list
    seen: dict


def _logs_and_returns_an_object(x, log, seen):
    y = x.sin()
    log.append(y)
    seen["n"] = seen.get("n", 0) + 1
    return types.SimpleNamespace(out=y * 2, log=log, n=len(log)), _Step(y.sum(), log, seen)


def test_an_argument_container_an_object_the_program_made_holds_is_the_callers_as_eager():
    # The object was rebuilt per call holding a new list (a copy of the caller's): appending to
    # ``ns.log`` after the call left the caller's list as it was, where eager's is the caller's.
    jf = thunder_rs.jit(_logs_and_returns_an_object)
    log, seen, eager_log, eager_seen = [], {}, [], {}
    for i in range(3):
        x = torch.randn(3)
        (ns, step), (eager_ns, eager_step) = jf(x, log, seen), _logs_and_returns_an_object(x, eager_log, eager_seen)
        assert ns.log is log and step.log is log and step.seen is seen
        assert eager_ns.log is eager_log and eager_step.seen is eager_seen
        _assert_same(
            (ns.out, ns.n, step.loss, log, seen), (eager_ns.out, eager_ns.n, eager_step.loss, eager_log, eager_seen)
        )
        ns.log.append(i), eager_ns.log.append(i)  # (the caller's list, changed through the returned object)
        _assert_same(log, eager_log)
