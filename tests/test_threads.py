"""A jitted function or module called from several threads at once computes what eager computes.

Threads start together at a barrier; where a test needs one thread to act while another traces,
the traced program hands over through ``queue.SimpleQueue`` (C objects without attributes, so the
handshake is no Python state of the program) and the other thread acts at that point. What each
thread computes is compared with eager in that thread (grad mode and autocast are per thread in
torch, and so is the cache key that holds them).
"""

import contextlib
import queue
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from torch import nn

import thunder_rs
from thunder_rs.core.lang import snapshots as snapshots_module
from thunder_rs.core.lang import values as values_module
from thunder_rs.core.run import entry as entry_module
from thunder_rs.core.run import jit as jit_module

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from gpt import GPT, GPTConfig, random_tokens  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def _together(n: int, work) -> list:
    """``work(i)`` for i < n, on n threads that start at once; the results in order (an error raised)."""
    barrier = threading.Barrier(n)

    def run(i):
        barrier.wait()
        return work(i)

    with ThreadPoolExecutor(n) as pool:
        return [f.result() for f in [pool.submit(run, i) for i in range(n)]]


def _grads_match(outputs, expected, params, **tolerance) -> None:
    got = torch.autograd.grad(outputs, params, allow_unused=True)
    want = torch.autograd.grad(expected, params, allow_unused=True)
    for g, w in zip(got, want):
        if w is None:
            assert g is None
        else:
            torch.testing.assert_close(g, w, **tolerance)


class _HandOver:
    """Lets another thread act while a traced program is paused: the program calls ``pause()``
    (the first time only), which runs ``act`` on another thread and waits for it."""

    def __init__(self, act):
        self._armed, self._to_actor, self._to_program = queue.SimpleQueue(), queue.SimpleQueue(), queue.SimpleQueue()
        self._armed.put(True)
        self._actor = threading.Thread(target=self._run, args=(act,))
        self._actor.start()

    def _run(self, act):
        if self._to_actor.get():
            act()
        self._to_program.put(True)

    def pause(self):
        try:
            self._armed.get_nowait()
        except queue.Empty:
            return
        self._to_actor.put(True)
        self._to_program.get()

    def join(self):
        self._to_actor.put(False)  # (where the program never paused)
        self._actor.join()


# -- many threads, one model ----------------------------------------------------------------------


def test_threads_calling_the_demo_gpt_compute_what_eager_computes_and_compile_each_key_once():
    config = GPTConfig(block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=16)
    model = GPT(config, seed=0)
    jm = thunder_rs.jit(model, dynamic=False)
    # Four shapes, with and without grad: some threads compile while others find the entry.
    cases = [((1 + i % 2, 4 + 2 * (i % 4 // 2)), i % 3 != 0) for i in range(8)]
    params = list(model.parameters())

    def call(i):
        (batch, seq), grad = cases[i]
        idx = random_tokens(config, batch, seq, seed=i)
        with torch.set_grad_enabled(grad):
            (logits, _), (expected, _) = jm(idx, idx), model(idx, idx)
        assert logits.requires_grad == expected.requires_grad
        torch.testing.assert_close(logits, expected)
        if grad:
            _grads_match(logits.square().sum(), expected.square().sum(), params)

    _together(8, call)
    stats = thunder_rs.compile_stats(jm)
    assert stats.cache_misses == len({(shape, grad) for shape, grad in cases})
    assert stats.calls == 8


@pytest.mark.slow  # about 8 s (importing transformers, two compiles with grad)
def test_threads_calling_a_tiny_hugging_face_model_compute_what_eager_computes():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2, n_head=2, n_embd=32, n_positions=32, vocab_size=99, bos_token_id=1, eos_token_id=2
    )
    model = transformers.GPT2LMHeadModel(config).eval()
    jm = thunder_rs.jit(model)
    shapes = [(1, 4), (2, 6), (1, 4), (2, 6)]
    params = list(model.parameters())

    def call(i):
        batch, seq = shapes[i]
        ids = torch.randint(3, 99, (batch, seq), generator=torch.Generator().manual_seed(i))
        mask = torch.ones(batch, seq, dtype=torch.long)
        mask[-1, :1] = 0  # (padding on the left of the last text)
        out = jm(input_ids=ids, attention_mask=mask, labels=ids)
        expected = model(input_ids=ids, attention_mask=mask, labels=ids)
        torch.testing.assert_close(out.logits, expected.logits)
        torch.testing.assert_close(out.loss, expected.loss)
        _grads_match(out.loss, expected.loss, params, rtol=1e-4, atol=1e-5)

    _together(4, call)


def test_first_calls_of_one_key_on_many_threads_compile_it_once():
    jf = thunder_rs.jit(lambda x: torch.tanh(x) * 2 + 1)
    x = torch.randn(5)
    outs = _together(8, lambda i: jf(x))
    for out in outs:
        torch.testing.assert_close(out, torch.tanh(x) * 2 + 1)
    stats = thunder_rs.compile_stats(jf)
    assert (stats.cache_misses, stats.cache_hits) == (1, 7)


@pytest.mark.filterwarnings("ignore:.*recompiled")
def test_threads_calling_past_the_cache_size_compute_what_eager_computes():
    jf = thunder_rs.jit(lambda x: torch.sin(x) * 2, cache=2, dynamic=False)
    xs = [torch.randn(n) for n in range(1, 5)]

    def call(i):
        for k in range(12):  # (each thread's calls go round the four sizes: entries are evicted)
            x = xs[(i + k) % 4]
            torch.testing.assert_close(jf(x), torch.sin(x) * 2)

    _together(4, call)
    stats = thunder_rs.compile_stats(jf)
    assert stats.calls == 48 and stats.evictions == stats.cache_misses - 2


def test_grad_mode_inference_mode_and_autocast_are_the_calling_threads():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 4))
    jm = thunder_rs.jit(model)
    x = torch.randn(3, 8)
    modes = [
        torch.no_grad,
        torch.enable_grad,
        lambda: torch.autocast("cpu", dtype=torch.bfloat16),
        torch.inference_mode,
    ] * 2

    def call(i):
        with modes[i]():
            out, expected = jm(x), model(x)
        assert (out.dtype, out.requires_grad, out.is_inference()) == (
            expected.dtype,
            expected.requires_grad,
            expected.is_inference(),
        )
        torch.testing.assert_close(out, expected)

    _together(8, call)
    stats = thunder_rs.compile_stats(jm)
    assert stats.cache_misses == 4, stats.miss_reasons  # (one per mode: the reasons, were it flaky)


def test_backward_on_another_thread_and_two_backward_passes_at_once_give_eagers_gradients():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 4))
    jm = thunder_rs.jit(model)
    x = torch.randn(2, 4, requires_grad=True)
    params = [x, *model.parameters()]
    outs = [jm(x * (i + 1)).square().sum() for i in range(4)]
    expected = [model(x * (i + 1)).square().sum() for i in range(4)]
    with ThreadPoolExecutor(1) as pool:  # the forward's thread is not the backward's
        got = pool.submit(torch.autograd.grad, outs[0], params, retain_graph=True).result()
    for g, w in zip(got, torch.autograd.grad(expected[0], params, retain_graph=True)):
        torch.testing.assert_close(g, w)
    got = _together(4, lambda i: torch.autograd.grad(outs[i], params))
    for i in range(4):
        for g, w in zip(got[i], torch.autograd.grad(expected[i], params)):
            torch.testing.assert_close(g, w)


def test_parameters_another_thread_updates_between_calls_are_read_at_call_time():
    torch.manual_seed(0)
    model = nn.Linear(4, 4)
    jm = thunder_rs.jit(model)
    x = torch.randn(2, 4)
    steps, callers = 4, 3
    barrier = threading.Barrier(callers + 1)

    def update():
        for step in range(steps):
            with torch.no_grad():
                model.weight.add_(0.5)  # in place, as an optimizer steps
            if step % 2:
                model.bias = nn.Parameter(torch.randn(4))  # a new tensor in the slot
            barrier.wait()  # the callers call
            barrier.wait()

    def call(i):
        for _ in range(steps):
            barrier.wait()
            torch.testing.assert_close(jm(x), model(x))
            barrier.wait()

    updater = threading.Thread(target=update)
    updater.start()
    _together(callers, call)
    updater.join()
    assert thunder_rs.compile_stats(jm).cache_misses == 1


# -- another thread writes the module while a call compiles ---------------------------------------


class _Scaled(nn.Module):
    def __init__(self, pause):
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.scale = 2.0
        self.tag = "a"
        self.pause = pause

    def forward(self, x):
        y = self.lin(x) * self.scale
        self.pause()
        return y


def _scaled_with(act):
    """A module whose first traced forward pauses while ``act(module)`` runs on another thread."""
    holder: list = []
    hand_over = _HandOver(lambda: act(holder[0]))
    torch.manual_seed(0)
    holder.append(_Scaled(hand_over.pause))
    return holder[0], hand_over


def test_module_attributes_another_thread_sets_while_a_call_compiles_stay_as_it_set_them():
    # Tracing took that thread's writes for the program's: every call undid them (and deleting
    # ``extra`` again raised AttributeError on the second call).
    def act(m):
        m.tag = "b"
        m.extra = 1

    model, hand_over = _scaled_with(act)
    jm = thunder_rs.jit(model)
    x = torch.randn(1, 2)
    out = jm(x)
    hand_over.join()
    torch.testing.assert_close(out, model(x))
    assert (model.tag, model.extra) == ("b", 1)
    model.tag = "c"
    del model.extra
    torch.testing.assert_close(jm(x), model(x))
    assert (model.tag, hasattr(model, "extra")) == ("c", False)


def test_an_attribute_the_program_reads_set_by_another_thread_while_it_compiles_is_read_by_the_next_call():
    # The change was refused as the program's own write ("the traced program changed Python state
    # it read: _Scaled.scale changed from 2.0 to 5.0").
    model, hand_over = _scaled_with(lambda m: setattr(m, "scale", 5.0))
    jm = thunder_rs.jit(model)
    x = torch.randn(1, 2)
    with torch.no_grad():
        first = jm(x)
        hand_over.join()
        torch.testing.assert_close(first, model.lin(x) * 2.0)  # (read before the write, as eager's call would)
        torch.testing.assert_close(jm(x), model(x))
    assert model.scale == 5.0
    assert thunder_rs.compile_stats(jm).cache_misses == 2


@pytest.mark.parametrize("change", ["submodule", "buffer"])
def test_the_module_structure_another_thread_changes_while_a_call_compiles_is_the_next_calls(change):
    # Refused as the program's own change of the structure; once that was not, the call ran the
    # entry compiled for the old structure on the new one's tensors (TypeError: takes 4 arguments).
    def act(m):
        if change == "submodule":
            m.lin = nn.Linear(2, 2)
        else:
            m.register_buffer("offset", torch.ones(2))

    model, hand_over = _scaled_with(act)
    jm = thunder_rs.jit(model)
    x = torch.randn(1, 2)
    with torch.no_grad():
        out = jm(x)
        hand_over.join()
        torch.testing.assert_close(out, model(x))
        torch.testing.assert_close(jm(x), model(x))


# -- another thread writes while a call checks its entry -------------------------------------------


def _in_another_thread(fn) -> None:
    worker = threading.Thread(target=fn)
    worker.start()
    worker.join()


def test_a_module_write_made_while_a_call_checks_the_module_guards_is_checked_by_the_next_call(monkeypatch):
    # The check recorded the write count as it was after the write, so the next call skipped the
    # module guards and ran with scale 2.0.
    torch.manual_seed(0)
    model = _Scaled(lambda: None)
    jm = thunder_rs.jit(model)
    x = torch.randn(1, 2)
    with torch.no_grad():
        jm(x)
    compile_check, armed = entry_module.compile_check, [True]

    def checked_while_written(guards):
        check = compile_check(guards)

        def run(flat):
            held = check(flat)
            if armed and held:
                armed.clear()
                _in_another_thread(lambda: setattr(model, "scale", 5.0))
            return held

        return run

    monkeypatch.setattr(entry_module, "compile_check", checked_while_written)
    model.tag = "b"  # (a module write: the next call checks the module guards)
    with torch.no_grad():
        jm(x)
        assert not armed
        torch.testing.assert_close(jm(x), model(x))


def test_a_hook_registered_while_a_call_compares_the_hooks_runs_on_the_next_call(monkeypatch):
    torch.manual_seed(0)
    model = _Scaled(lambda: None)
    jm = thunder_rs.jit(model)
    x = torch.randn(1, 2)
    with torch.no_grad():
        jm(x)
    hook_snapshot, armed = entry_module.hook_snapshot, [True]

    def snapshot_while_registering(modules):
        found = hook_snapshot(modules)
        if armed:
            armed.clear()
            _in_another_thread(lambda: model.lin.register_forward_hook(lambda m, a, out: out * 10))
        return found

    monkeypatch.setattr(entry_module, "hook_snapshot", snapshot_while_registering)
    nn.Linear(1, 1).register_forward_hook(lambda *a: None)  # (moves the hooks' version)
    with torch.no_grad():
        jm(x)
        assert not armed
        torch.testing.assert_close(jm(x), model(x))


def test_a_hook_registered_on_the_jitted_module_while_a_call_looks_for_hooks_runs_on_the_next_call(monkeypatch):
    torch.manual_seed(0)
    model = nn.Linear(2, 2)
    jm = thunder_rs.jit(model)
    x = torch.randn(1, 2)
    with torch.no_grad():
        jm(x)
    names = jit_module._WRAPPER_HOOKS

    class Registering:
        """The wrapper's hook stores, with a hook registered on the wrapper once they were read."""

        def __iter__(self):
            yield from names
            monkeypatch.setattr(jit_module, "_WRAPPER_HOOKS", names)
            _in_another_thread(lambda: jm.register_forward_hook(lambda m, a, out: out * 10))

    monkeypatch.setattr(jit_module, "_WRAPPER_HOOKS", Registering())
    nn.Linear(1, 1).register_forward_hook(lambda *a: None)  # (moves the hooks' version)
    with torch.no_grad():
        jm(x)
        assert jit_module._WRAPPER_HOOKS is names
        torch.testing.assert_close(jm(x), model(x) * 10)


# -- another thread draws random numbers while a call compiles ------------------------------------


@pytest.mark.parametrize("read", ["branch", "item"])
def test_numbers_another_thread_draws_while_a_call_is_traced_are_not_drawn_again(monkeypatch, read):
    # Tracing a program that reads values runs it so far (``snapshots``), and set the generators
    # back after each run: the draws another thread made meanwhile were undone, and drawn again.
    def f(x):
        y = x.sin() * 2
        if read == "branch":
            return y + 1 if y.sum() > 0 else y - 1
        return y * y.max().item()

    drawn: list = []

    def drawing_meanwhile(original):
        @contextlib.contextmanager
        def run(*args, **kwargs):
            with original(*args, **kwargs):
                _in_another_thread(lambda: drawn.append(torch.rand(8)))
                yield

        return run

    for module in (snapshots_module, values_module):
        monkeypatch.setattr(module, "outside_the_trace", drawing_meanwhile(module.outside_the_trace))
    torch.manual_seed(0)
    x = torch.randn(16, requires_grad=True)  # (the first call computes again: no outputs of tracing to return)
    torch.testing.assert_close(thunder_rs.jit(f)(x), f(x))
    assert drawn
    later = torch.rand(8)
    for numbers in drawn:
        assert not torch.equal(numbers, later)
