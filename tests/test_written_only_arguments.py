"""Lists, dicts and deques passed as arguments that the program only writes into, next to eager.

What differed: a training loop's log (``log.append(loss)``) or metrics dict grown by every call
was part of the cache key by its items, so every call compiled again (and evicted older entries);
a ``collections.deque`` argument the program changed was refused. A container the program's code
only writes into is now keyed by its type (``core.acquisition.written_only``), and a deque the
program reads is changed as a list is (``core.acquisition.argument_containers``).
"""

import collections
import inspect
import sys
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
    elif isinstance(a, (list, tuple, collections.deque)):
        assert len(a) == len(b) and getattr(a, "maxlen", None) == getattr(b, "maxlen", None)
        for x, y in zip(a, b):
            _assert_same(x, y)
    else:
        assert a == b


def _step(x, w, log, metrics):
    loss = (x @ w).pow(2).mean()
    log.append(loss.detach())
    log.extend([loss.detach() * 2, 1])
    metrics["loss"] = loss.detach()
    metrics[("step", "done")] = True
    return loss


def test_a_log_and_metrics_the_program_only_writes_into_hit_the_cache_as_they_grow():
    # Each call compiled again: the key held the list's length and the dict's keys.
    jf, w = thunder_rs.jit(_step), torch.randn(3, 2, requires_grad=True)
    eager_w = w.detach().clone().requires_grad_()
    log, metrics, eager_log, eager_metrics = [], {"seen": 0}, [], {"seen": 0}
    held = log, metrics
    for i in range(5):
        x = torch.randn(4, 3)
        loss, eager_loss = jf(x, w, log, metrics), _step(x, eager_w, eager_log, eager_metrics)
        _assert_same(loss.detach(), eager_loss.detach())
        loss.backward(), eager_loss.backward()
        _assert_same((log, metrics), (eager_log, eager_metrics))
        metrics[i], eager_metrics[i] = i, i  # (the caller's own writes between calls)
    assert torch.equal(w.grad, eager_w.grad)
    assert (log, metrics) == held and log is held[0] and metrics is held[1]
    assert thunder_rs.cache_misses(jf) == 1 and thunder_rs.cache_hits(jf) == 4


def _keyword_log(x, *, log):
    log.append(x.sum())
    return x * 2


def test_a_keyword_log_and_one_grown_by_the_caller_hit_the_cache():
    jf, log, eager = thunder_rs.jit(_keyword_log), [], []
    for i in range(4):
        x = torch.randn(2)
        _assert_same(jf(x, log=log), _keyword_log(x, log=eager))
        _assert_same(log, eager)
        log.append(torch.ones(i + 1)), eager.append(torch.ones(i + 1))
    assert thunder_rs.cache_misses(jf) == 1


def _reads_length(x, log):
    log.append(x)
    return x * len(log)


def _reads_last(x, log):
    log.append(x * 2)
    return log[-1] + log[0]


def _passes_on(x, log):
    _helper(log, x)
    return x


def _helper(log, x):
    log.append(x * len(log))


def test_a_log_the_program_reads_keeps_its_length_in_the_key_as_eager_needs():
    for program in (_reads_length, _reads_last, _passes_on):
        jf, log, eager = thunder_rs.jit(program), [torch.ones(2)], [torch.ones(2)]
        for i in range(3):
            x = torch.randn(2)
            _assert_same(jf(x, log), program(x, eager))
            _assert_same(log, eager)
        assert thunder_rs.cache_misses(jf) == 3  # (each length its own compile)
        assert "number of inputs changed" in thunder_rs.compile_stats(jf).miss_reasons[1]


def _counts(x, log, stats):
    log.append(x.sum())
    stats["n"] += 1
    return x * stats["n"]


def test_a_counter_in_a_dict_stops_compiling_next_to_a_growing_log():
    # Every call compiled (the log's length); the counter is now an int input after it changed.
    jf, log, stats, eager_log, eager_stats = thunder_rs.jit(_counts), [], {"n": 5}, [], {"n": 5}
    for i in range(6):
        x = torch.randn(2)
        _assert_same(jf(x, log, stats), _counts(x, eager_log, eager_stats))
        _assert_same((log, stats), (eager_log, eager_stats))
    assert thunder_rs.cache_misses(jf) == 2


def _queues(x, q):
    q.append(x)
    q.appendleft(x * 2)
    q.extend([x * 3, 4])
    return x + 1


def _pops(x, q):
    q.append(x * 2)
    return x + q.popleft()


def test_a_deque_argument_is_changed_as_eager():
    # Refused: "the traced program changed a list or dict it was given as an argument".
    for program, maxlen, start in ((_queues, 3, 0), (_queues, None, 0), (_pops, 2, 1)):
        jf = thunder_rs.jit(program)
        q, eager = (collections.deque([torch.zeros(2)] * start, maxlen=maxlen) for _ in range(2))
        held = q
        for i in range(4):
            x = torch.randn(2)
            _assert_same(jf(x, q), program(x, eager))
            _assert_same(q, eager)
        assert q is held and thunder_rs.cache_misses(jf) == 1


def _fails(x, log):
    log.append(1)
    log.append("two")
    raise ValueError("after appending")


def test_a_log_written_before_the_programs_error_keeps_the_writes_as_eager():
    log, eager = [0], [0]
    for fn, target in ((thunder_rs.jit(_fails), log), (_fails, eager)):
        try:
            fn(torch.ones(2), target)
        except ValueError:
            pass
    assert log == eager == [0, 1, "two"]


def _counts_with_loss(x, stats):
    stats["n"] += 1
    stats["loss"] = (x * stats["n"]).sum()
    return x * stats["n"] + stats["scale"]


def _plain_counter(x, n):
    return x * (n + 1), n + 1


def test_a_counter_in_a_dict_the_caller_also_fills_compiles_as_a_plain_int_counter():
    # Every call compiled: the key held the dict's other items (its keys, the caller's tensor).
    for start in (5, 0):
        jf, plain = thunder_rs.jit(_counts_with_loss), thunder_rs.jit(_plain_counter)
        stats, eager, n = {"n": start, "scale": 2.0}, {"n": start, "scale": 2.0}, start
        held = stats
        for i in range(6):
            x = torch.randn(2)
            _assert_same(jf(x, stats), _counts_with_loss(x, eager))
            _assert_same(stats, eager)
            stats["hist"], eager["hist"] = torch.ones(i + 1), torch.ones(i + 1)  # (the caller's, grown)
            n = plain(x, n)[1]
        assert stats is held and type(stats["n"]) is int
        # As an int argument: 0 and 1 are specialised, the counter symbolic once seen changing from 2 up.
        assert thunder_rs.cache_misses(jf) == thunder_rs.cache_misses(plain) == (2 if start else 3)
        assert thunder_rs.compile_stats(jf).miss_reasons[-1].endswith("compiled with symbolic sizes stats['n']")


def _moves(x, d):
    d["old"] = d["new"]
    d["new"] = x * 2
    return d["kept"] + x


def _reads_missing(x, d):
    d["seen"] = True
    d["n"] += 1
    return x


def test_a_dict_read_at_constant_keys_moves_and_misses_items_as_eager():
    jf = thunder_rs.jit(_moves)
    for i in range(3):
        t, x = torch.randn(2), torch.randn(2)
        d, eager = {"new": t, "kept": x, "other": i}, {"new": t, "kept": x, "other": i}
        _assert_same(jf(x, d), _moves(x, eager))
        _assert_same(d, eager)
        assert d["old"] is t
    assert thunder_rs.cache_misses(jf) == 1
    d, eager = {"other": 1}, {"other": 1}
    for fn, target in ((thunder_rs.jit(_reads_missing), d), (_reads_missing, eager)):
        with pytest.raises(KeyError, match="'n'"):
            fn(torch.ones(2), target)
    _assert_same(d, eager)


def _writes_a_reads_b(x, a, b):
    a.append(x)
    return x * len(b)


def _into_item_reads_b(x, d, b):
    d["log"].append(x)
    return x * len(b)


def test_a_log_passed_again_where_the_program_reads_it_is_refused_before_running():
    # The compiled call appended to the caller's list, where the read was of the copy traced.
    jf, a, b = thunder_rs.jit(_writes_a_reads_b), [], []
    _assert_same(jf(torch.ones(2), a, b), _writes_a_reads_b(torch.ones(2), [], []))
    shared = [torch.zeros(1)]
    with pytest.raises(ThunderNotImplementedError, match="list at positional argument 2 is also passed at positional"):
        jf(torch.ones(2), shared, shared)
    assert len(shared) == 1
    jf = thunder_rs.jit(_into_item_reads_b)
    _assert_same(jf(torch.ones(2), {"log": []}, []), _into_item_reads_b(torch.ones(2), {"log": []}, []))
    with pytest.raises(ThunderNotImplementedError, match=r"1\['log'\] is also passed at positional argument 2"):
        jf(torch.ones(2), {"log": shared}, shared)
    assert len(shared) == 1


def test_a_log_holding_one_dict_twice_is_appended_to_as_eager():
    # Refused as "a dict passed in two places": the check walked every item of the log, each call.
    jf, held = thunder_rs.jit(_keyword_log), {"k": 1}
    log, eager = [held, held], [held, held]
    for i in range(3):
        x = torch.randn(2)
        _assert_same(jf(x, log=log), _keyword_log(x, log=eager))
        _assert_same(log, eager)
    assert log[0] is held and log[1] is held


def _tallies(x, metrics):
    loss = x.pow(2).sum()
    metrics["steps"] = metrics.get("steps", 0) + 1
    metrics.setdefault("first", None)
    metrics["last"] = loss.detach() * metrics.get("scale", 1.0)
    return loss


def test_a_metrics_dict_read_with_get_and_setdefault_at_constant_keys_keeps_the_callers_items_out_of_the_key():
    # Every call compiled: the key held the caller's own items (a tensor of the call's batch size).
    jf, metrics, eager = thunder_rs.jit(_tallies), {"scale": 0.5}, {"scale": 0.5}
    held = metrics
    for i in range(6):
        x = torch.randn(3)
        _assert_same(jf(x, metrics), _tallies(x, eager))
        _assert_same(metrics, eager)
        metrics["batch"], eager["batch"] = torch.ones(i + 1), torch.ones(i + 1)
    assert metrics is held
    # The first call (no "steps"), a call with steps 1, then steps as an int input.
    reasons = thunder_rs.compile_stats(jf).miss_reasons
    assert len(reasons) == 3 and reasons[2] == "metrics['steps']: 1 -> 2; compiled with symbolic sizes metrics['steps']"


def _logs_into_items(x, metrics):
    loss = x.pow(2).sum()
    metrics["steps"] = metrics.get("steps", 0) + 1
    metrics.setdefault("losses", []).append(loss.detach())
    metrics["grads"].extend([loss * 2])
    return loss


def test_lists_in_a_metrics_dict_the_program_only_appends_to_hit_the_cache_as_they_grow():
    # Every call compiled: the key held the lists' lengths.
    jf, grads, eager_grads = thunder_rs.jit(_logs_into_items), [], []
    metrics, eager = {"grads": grads}, {"grads": eager_grads}
    for i in range(6):
        x = torch.randn(3)
        _assert_same(jf(x, metrics), _logs_into_items(x, eager))
        _assert_same(metrics, eager)
    losses = metrics["losses"]
    jf(torch.ones(3), metrics)
    assert metrics["grads"] is grads and metrics["losses"] is losses and len(losses) == 7
    # The first call (no "steps" nor "losses"), a call with them, then steps as an int input.
    assert thunder_rs.cache_misses(jf) == 3


def _positional_log(x, log, /, **options):
    log.append(x)
    return x + len(options["log"])


def _appends_by_keyword(x, log):
    log.append(value=x)


def test_a_write_only_parameter_keeps_eagers_keywords_and_errors():
    # (Guards the keying above: a keyword of the name of a positional-only log is another argument.)
    jf, log, eager = thunder_rs.jit(_positional_log), [], []
    for n in (1, 2):
        _assert_same(jf(torch.ones(2), log, log=[0] * n), _positional_log(torch.ones(2), eager, log=[0] * n))
        _assert_same(log, eager)
    for fn in (thunder_rs.jit(_appends_by_keyword), _appends_by_keyword):
        with pytest.raises(TypeError, match=r"list.append\(\) takes no keyword arguments"):
            fn(torch.ones(2), [])


def _rotates(x, d):
    d["log"].append(x * 2)
    d["log"] = []
    return x


def test_a_list_appended_to_then_replaced_in_its_dict_is_left_as_eager_leaves_it():
    # (Guards the order of the writes: the appends go to the list the call found.)
    jf, first, eager_first = thunder_rs.jit(_rotates), [], []
    d, eager = {"log": first}, {"log": eager_first}
    for i in range(3):
        x = torch.randn(2)
        previous, eager_previous = d["log"], eager["log"]
        _assert_same(jf(x, d), _rotates(x, eager))
        _assert_same((d, previous), (eager, eager_previous))
        assert d["log"] is not previous and len(previous) == 1


def _length_of_callers_log():
    return len(sys._getframe(1).f_locals["log"])


def _reads_through_the_frame(x, log):
    log.append(x)
    return x * _length_of_callers_log()


def test_a_write_only_log_read_through_the_functions_frame_is_refused_saying_so():
    # A TypeError naming thunder_rs's stand-in ("object of type 'WriteLog' has no len()").
    log = []
    with pytest.raises(ThunderNotImplementedError, match=r"only writes into was read \(len\)"):
        thunder_rs.jit(_reads_through_the_frame)(torch.ones(2), log)
    assert log == []


_ALIASED: list = []


def _reads_the_log_as_a_global(x, log):
    log.append(x.sum())
    return x * len(_ALIASED)  # (the same list as ``log`` when the caller passes it)


def test_a_write_only_list_also_read_as_a_global_is_eagers_or_refused():
    jfn = thunder_rs.jit(_reads_the_log_as_a_global)
    x = torch.ones(2)
    for n in range(3):
        _ALIASED[:] = [0] * n
        expected = _reads_the_log_as_a_global(x, _ALIASED)
        _ALIASED[:] = [0] * n
        try:
            actual = jfn(x, _ALIASED)
        except ThunderNotImplementedError:
            continue
        _assert_same(actual, expected)


def _logs_counts_and_moves(x, w, log, metrics, q, cfg):
    loss = (x @ w).pow(2).mean()
    log.append(loss.detach())
    log.extend([loss.detach() * 2, 1])
    q.appendleft(x.sum())
    q.extendleft([loss.detach(), 3])
    metrics["n"] += 1
    metrics[("step", "done")] = True
    cfg["last"], cfg["best"] = cfg["best"], loss.detach()
    return loss


def _count_pytree_calls(monkeypatch, calls: list) -> None:
    """Notes in ``calls`` each call of torch's pytree flatten and unflatten from now on."""
    from torch.utils import _pytree as pytree  # noqa: PLC0415

    for owner, name in ((pytree, "tree_unflatten"), (pytree, "tree_flatten"), (pytree.TreeSpec, "unflatten")):
        real = getattr(owner, name)
        monkeypatch.setattr(owner, name, lambda *a, real=real, name=name, **k: calls.append(name) or real(*a, **k))


def test_a_hits_writes_into_argument_containers_are_eagers_without_rebuilding_them_through_pytree(monkeypatch):
    # Every hit rebuilt its writes (and its outputs) through torch's pytree, ~1 us a node, and
    # copied the caller's dict to merge its items: ~72 us a call against eager's 13 us.
    jf, w = thunder_rs.jit(_logs_counts_and_moves), torch.randn(3, 2)
    made = [
        ([], {"n": 0, "own": "caller"}, collections.deque(maxlen=5), {"best": torch.zeros(()), "kept": 1})
        for _ in range(2)
    ]
    held = [(c, *map(id, c)) for c in made]
    rebuilt: list = []
    for i in range(8):
        if i == 4:  # (a counter compiles thrice, as an int argument, and is classed on the next call)
            _count_pytree_calls(monkeypatch, rebuilt)
        x, best = torch.randn(4, 3), made[0][3]["best"]
        _assert_same(jf(x, w, *made[0]), _logs_counts_and_moves(x, w, *made[1]))
        _assert_same(made[0], made[1])
        assert made[0][3]["last"] is best  # (the caller's own object, moved)
    assert rebuilt == []
    assert [(c, *map(id, c)) for c in made] == held and list(made[0][1]) == ["n", "own", ("step", "done")]
    assert thunder_rs.cache_misses(jf) == 3 and made[0][1]["n"] == 8


class _Pair(tuple):
    """A tuple torch's pytree keeps whole (no namedtuple): keyed by identity, its items not."""


def _appends(x, log, pair):
    log.append(x * 2)
    return x + 1


def test_a_log_also_held_by_a_tuple_kept_whole_is_refused_on_a_later_hit():
    # Where a call's containers are is found once per entry; a tuple kept whole (its items out of
    # the key) is looked into on every call, as a list it holds may hold the log later.
    jf, log, inner = thunder_rs.jit(_appends), [], []
    pair = _Pair((inner,))
    for _ in range(2):
        _assert_same(jf(torch.ones(2), log, pair), torch.ones(2) + 1)
    inner.append(log)
    with pytest.raises(ThunderNotImplementedError, match=r"list at positional argument 2\[0\]\[0\] is also passed"):
        jf(torch.ones(2), log, pair)
    assert len(log) == 2 and thunder_rs.cache_hits(jf) >= 1


_STATS = {"n": 0}
_HOLDER = types.SimpleNamespace(hist=[])


def _reads_an_attribute(x, log):
    log.append(x.sum())
    return x * len(_HOLDER.hist)


def _closure_reading():
    seen: list = []

    def reads_the_closure(x, log):
        log.append(x.sum())
        return x * len(seen)

    return reads_the_closure, seen


def _counts_into_a_global(x, stats):
    stats["n"] = stats.get("n", 0) + 1
    return x * _STATS["n"]


def _logs_into_an_item(x, d):
    d["log"].append(x.sum())
    return x * len(_ALIASED)


def _reads_its_length(x, log):
    log.append(x.sum())
    return x * len(log) + len(_ALIASED)


def _appends_to_the_global(x, log):
    _ALIASED.append(x.sum())
    return x * len(log)


_NESTED = [[0]]  # (plain values: read whole, its item unseen)
_QUEUE = collections.deque([0])


def _reads_a_held_list(x, log):
    log.append(x.sum())
    return x * len(_NESTED[0])


def _reads_a_global_deque(x, q):
    q.append(x.sum())
    return x * len(_QUEUE)


_READS_CLOSURE, _CLOSED = _closure_reading()
#: ``(program, the arguments after x, what the error names, the text of the line it names)``
_ALSO_STATE = [
    (_reads_the_log_as_a_global, lambda: (_ALIASED,), "global '_ALIASED'", "len(_ALIASED)"),
    (_reads_an_attribute, lambda: (_HOLDER.hist,), "hist", "len(_HOLDER.hist)"),
    (_READS_CLOSURE, lambda: (_CLOSED,), "closure variable 'seen'", "len(seen)"),
    (_counts_into_a_global, lambda: (_STATS,), "global '_STATS'", '_STATS["n"]'),
    (_logs_into_an_item, lambda: ({"log": _ALIASED},), r"1\['log'\] is also global '_ALIASED'", "len(_ALIASED)"),
    (_reads_its_length, lambda: (_ALIASED,), "global '_ALIASED'", "len(_ALIASED)"),
    (_appends_to_the_global, lambda: (_ALIASED,), "global '_ALIASED'", "_ALIASED.append"),
    (_reads_a_held_list, lambda: (_NESTED[0],), "an item of global '_NESTED'", "len(_NESTED[0])"),
    (_reads_a_global_deque, lambda: (_QUEUE,), "deque at positional argument 1 is also global '_QUEUE'", "len(_QUEUE)"),
]


def _state_as_found() -> list:
    """The state the programs of ``_ALSO_STATE`` read, each container holding one 0 (a 1 in _STATS)."""
    for held in (_ALIASED, _HOLDER.hist, _CLOSED, _NESTED[0], _QUEUE):
        held.clear(), held.append(0)
    _STATS.clear(), _STATS.update(n=1)
    return [list(_ALIASED), list(_HOLDER.hist), list(_CLOSED), dict(_STATS), [list(_NESTED[0])], list(_QUEUE)]


def _line_of(fn, text: str) -> str:
    """``file:line`` of the first line of ``fn`` holding ``text``."""
    lines, first = inspect.getsourcelines(fn)
    return f"{fn.__code__.co_filename}:{first + next(i for i, line in enumerate(lines) if text in line)}"


def _state_now() -> list:
    return [list(_ALIASED), list(_HOLDER.hist), list(_CLOSED), dict(_STATS), [list(_NESTED[0])], list(_QUEUE)]


@pytest.mark.parametrize("case", range(len(_ALSO_STATE)))
def test_a_list_or_dict_argument_the_program_also_reaches_as_state_runs_as_eager_warning_once_naming_both(case):
    # Silently different from eager: the program's reads of the one missed its writes into the other
    # (a global, an attribute, a closure variable, a dict read at constant keys, an item of an argument).
    program, arguments, named, line = _ALSO_STATE[case]
    jfn, x = thunder_rs.jit(program), torch.randn(2)
    for i in range(2):  # (compiled at the first call, found at the second)
        _state_as_found()
        expected = program(x, *arguments())
        eager_state = _state_now()
        _state_as_found()
        if i == 0:
            with pytest.warns(UserWarning, match=f"runs eagerly the calls .*{named}") as warned:
                actual = jfn(x, *arguments())
            assert _line_of(program, line) in str(warned[0].message)
        else:
            actual = jfn(x, *arguments())
        _assert_same(actual, expected)
        _assert_same(_state_now(), eager_state)
    assert thunder_rs.compile_stats(jfn).aliased_calls == 2 and thunder_rs.cache_misses(jfn) == 1


def test_a_new_log_each_call_hits_and_the_global_passed_later_runs_as_eager():
    # The entry compiled for distinct lists ran on the global too: len(_ALIASED) missed the append.
    jfn, x = thunder_rs.jit(_reads_the_log_as_a_global), torch.randn(2)
    _ALIASED[:] = [0, 0]
    for i in range(3):
        log, eager = [i], [i]
        _assert_same(jfn(x, log), _reads_the_log_as_a_global(x, eager))
        _assert_same(log, eager)
    with pytest.warns(UserWarning, match="positional argument 1 is also global '_ALIASED'"):
        actual = jfn(x, _ALIASED)
    assert len(_ALIASED) == 3
    del _ALIASED[-1]
    _assert_same(actual, _reads_the_log_as_a_global(x, _ALIASED))
    del _ALIASED[-1]  # (as the entry found it: its guard holds the global's items)
    _assert_same(jfn(x, []), _reads_the_log_as_a_global(x, []))
    assert thunder_rs.cache_misses(jfn) == 1 and thunder_rs.compile_stats(jfn).aliased_calls == 1
    # Read as a global and as an argument the program does not change: one object, as eager.
    jfn = thunder_rs.jit(_reads_the_global_and_the_argument)
    _STATS.clear(), _STATS.update(n=2)
    for i in range(2):
        log, eager = [], []
        _assert_same(jfn(x, log, _STATS), _reads_the_global_and_the_argument(x, eager, _STATS))
        _assert_same(log, eager)
    assert thunder_rs.cache_misses(jfn) == 1 and thunder_rs.compile_stats(jfn).aliased_calls == 0


def _reads_the_global_and_the_argument(x, log, cfg):
    log.append(x.sum())
    return x * cfg["n"] * _STATS["n"]


class _Logged(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.hist: list = []
        self.w = torch.nn.Parameter(torch.ones(2))

    def forward(self, x, log):
        log.append(x.sum())
        return x * self.w * len(self.hist)


def test_a_modules_list_passed_to_its_own_forward_that_changes_the_argument_runs_as_eager():
    # Silently x * w * 0, where eager's forward appended to self.hist first (x * w * 1).
    module, eager_module = _Logged(), _Logged()
    jfn, x = thunder_rs.jit(module), torch.randn(2)
    _assert_same(jfn(x, []).detach(), eager_module(x, []).detach())
    with pytest.warns(UserWarning, match=r"is also _Logged.hist, which the program reads at"):
        actual = jfn(x, module.hist)
    expected = eager_module(x, eager_module.hist)
    _assert_same(actual.detach(), expected.detach())
    actual.sum().backward(), expected.sum().backward()
    _assert_same((module.hist, module.w.grad), (eager_module.hist, eager_module.w.grad))


class _Box:
    def __init__(self):
        self.log: list = []


def _reads_the_box(x, log, box):
    log.append(x.sum())
    return x * len(box.log)


def test_a_log_an_argument_object_also_holds_is_refused_as_one_passed_twice():
    # Silently x * 0 where eager's len(box.log) saw the append (x * 1): the object's list is read as it is.
    jfn, x = thunder_rs.jit(_reads_the_box), torch.ones(2)
    for i in range(2):
        box, eager_box = _Box(), _Box()  # (a new box, with a new list, each call)
        log, eager = [], []
        _assert_same(jfn(x, log, box), _reads_the_box(x, eager, eager_box))
        _assert_same((log, box.log), (eager, eager_box.log))
        held = _Box()
        with pytest.raises(ThunderNotImplementedError, match=r"positional argument 1 is also passed at box.log"):
            jfn(x, held.log, held)
        assert held.log == []
    assert thunder_rs.cache_misses(jfn) == 1
