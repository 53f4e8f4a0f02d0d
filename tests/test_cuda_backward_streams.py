"""The streams each call's backward runs on, where the program makes a stream and computes on it
(``with torch.cuda.stream(made)``): eager's autograd runs each call's backward on the streams that
call's forward ran on, whichever call and whichever thread runs it. On the fake CUDA runtime
(``fake_cuda_runtime``), whose streams the program makes (``_Streams``); the GPU twin is
``test_cuda_queue``'s ``test_on_cuda_the_backward_of_a_block_on_a_stream_runs_on_that_stream_as_eagers``.
"""

import collections
import contextlib
import itertools
import threading

import pytest
import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

import thunder_rs
from fake_cuda_runtime import Stream

#: the kernels whose streams are compared (the loss's and autograd's own are left out)
_COMPUTED = ("sin", "cos", "exp", "mul", "neg")


def _makes_its_stream(x):
    made = torch.cuda.Stream()
    made.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(made):
        y = x.sin().exp()
    torch.cuda.current_stream().wait_stream(made)
    return y.cos()


class _Streams:
    """Makes the fake runtime's streams (``torch.cuda.Stream()`` wants the driver): ids from 10."""

    def __init__(self, monkeypatch):
        ids = itertools.count(10)
        monkeypatch.setattr(torch.cuda.Stream, "__new__", lambda cls, device=None, priority=0: Stream(0, next(ids)))


class _Launched(TorchDispatchMode):
    """``(kernel, stream)`` of each of ``_COMPUTED`` launched: the current stream, or with
    ``nodes``, the one eager's autograd runs the node being run on (noted on it as it was made)."""

    def __init__(self, runtime, nodes=False):
        super().__init__()
        self.runtime, self.nodes, self.seen = runtime, nodes, []

    def stream(self) -> int:
        return self.runtime.streams.get(0, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__.rstrip("_")
        out = func(*args, **(kwargs or {}))
        if name in _COMPUTED:
            node = torch._C._current_autograd_node() if self.nodes else None
            self.seen.append((name, node.metadata["stream"] if node is not None else self.stream()))
        return out


class _EagerNodes(torch.overrides.TorchFunctionMode):
    """Notes on each autograd node made the stream its forward ran on."""

    def __init__(self, runtime):
        super().__init__()
        self.runtime = runtime

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.grad_fn is not None and "stream" not in t.grad_fn.metadata:
                t.grad_fn.metadata["stream"] = self.runtime.streams.get(0, 0)
        return out


def _named(seen: list, streams: dict) -> collections.Counter:
    """The kernels with their streams named by the call whose forward ran on them (0: the default)."""
    return collections.Counter((kernel, streams.get(s, s)) for kernel, s in seen)


def _two_calls_backward_in_turn(fn, runtime, eager: bool, backward, device="cpu"):
    """Two calls' forwards, then their backwards, the later call's first, each by ``backward(out)``:
    per call (in that order), its index, output, input's gradient and backward's kernels with their streams."""
    xs = [torch.randn(3, device=device, requires_grad=True) for _ in range(2)]
    outs, streams = [], {}
    for k, x in enumerate(xs):
        with _EagerNodes(runtime) if eager else contextlib.nullcontext(), _Launched(runtime) as launched:
            outs.append(fn(x))
        streams.update({s: f"call {k}" for _, s in launched.seen if s != 0})
    results = []
    for k in (1, 0):
        launched = _Launched(runtime, nodes=eager)
        backward(outs[k], launched)
        results.append((k, outs[k].detach(), xs[k].grad, _named(launched.seen, streams)))
    return results


def _on_this_thread(out, launched):
    with launched:
        out.backward(torch.ones_like(out))


def _on_another_thread(out, launched):
    """The backward run by another thread (as autograd's device thread runs a CUDA backward)."""
    failed = []

    def run():
        try:
            _on_this_thread(out, launched)
        except BaseException as e:  # noqa: BLE001 (raised on the test's thread)
            failed.append(e)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if failed:
        raise failed[0]


@pytest.mark.parametrize("backward", [_on_this_thread, _on_another_thread], ids=["this_thread", "another_thread"])
def test_each_calls_backward_runs_on_the_stream_that_call_made_as_eagers(monkeypatch, backward):
    """Two calls each make a stream and compute on it; their backwards run later, in turn (and on
    another thread): each runs the block's backward on the stream its own call made, as eager's
    autograd does, with eager's values and gradients. (The compiled backward entered the stream
    made last on the thread running it, or by any thread: both calls' on the second call's.)"""
    import fake_cuda_runtime  # noqa: PLC0415 (without fake tensors: the values are compared)

    runtime = fake_cuda_runtime.install(monkeypatch)
    _Streams(monkeypatch)
    jf = thunder_rs.jit(_makes_its_stream)
    jf(torch.randn(3, requires_grad=True)).sum().backward()  # (the first call traces)
    for _ in range(2):
        torch.manual_seed(0)
        compiled = _two_calls_backward_in_turn(jf, runtime, False, backward)
        torch.manual_seed(0)
        expected = _two_calls_backward_in_turn(_makes_its_stream, runtime, True, backward)
        for (k, out, grad, streams), (_, expected_out, expected_grad, expected_streams) in zip(compiled, expected):
            assert streams == expected_streams and {s for _, s in expected_streams} == {0, f"call {k}"}
            assert torch.equal(out, expected_out) and torch.equal(grad, expected_grad)
        assert runtime.streams.get(0, 0) == 0


class _Cuda:
    """The current stream's id on a GPU, as the fake runtime's ``streams`` gives it (0: the default)."""

    @property
    def streams(self) -> dict:
        stream = torch.cuda.current_stream()
        return {0: 0 if stream == torch.cuda.default_stream() else stream.stream_id}


@pytest.mark.gpu
def test_on_cuda_each_calls_backward_runs_on_the_stream_that_call_made_as_eagers():
    """The GPU twin: two calls' forwards, then their backwards (on autograd's device thread), each
    on the stream its own call made, with eager's values and gradients."""
    jf = thunder_rs.jit(_makes_its_stream)
    jf(torch.randn(3, device="cuda", requires_grad=True)).sum().backward()
    for _ in range(2):
        torch.manual_seed(0)
        compiled = _two_calls_backward_in_turn(jf, _Cuda(), False, _on_this_thread, "cuda")
        torch.manual_seed(0)
        expected = _two_calls_backward_in_turn(_makes_its_stream, _Cuda(), True, _on_this_thread, "cuda")
        torch.cuda.synchronize()
        for (k, out, grad, streams), (_, expected_out, expected_grad, expected_streams) in zip(compiled, expected):
            assert streams == expected_streams and {s for _, s in expected_streams} == {0, f"call {k}"}
            assert torch.equal(out, expected_out) and torch.equal(grad, expected_grad)


#: streams made outside the program (the program reads them from this module)
SIDE, OTHER = Stream(0, stream_id=3), Stream(0, stream_id=5)


def _side_block_without_gradients(x):
    y = x.sin()
    with torch.cuda.stream(SIDE):
        scale = x.detach() * 2
    torch.cuda.current_stream().wait_stream(SIDE)
    return y * scale


def _side_block_of_a_gradient(x):
    y = x.sin()
    with torch.cuda.stream(SIDE):
        z = y.exp()
    torch.cuda.current_stream().wait_stream(SIDE)
    return z


def _nested_block_without_gradients(x):
    y = x.sin()
    with torch.cuda.stream(SIDE):
        with torch.cuda.stream(OTHER):
            scale = x.detach() * 2
        z = y.exp()
    torch.cuda.current_stream().wait_stream(SIDE)
    return z * scale


@pytest.mark.parametrize(
    "fn", [_side_block_without_gradients, _side_block_of_a_gradient, _nested_block_without_gradients]
)
def test_a_backward_waits_for_a_blocks_stream_only_where_it_runs_kernels_there_as_eagers(monkeypatch, fn):
    """The backward of a block on a stream switches to it and waits between the streams only where
    a gradient is computed there: eager's autograd runs nothing on a stream whose forward made no
    node. (The compiled backward waited for the side stream, and it for the default one, around a
    block that runs no kernels.)"""
    import fake_cuda_runtime  # noqa: PLC0415 (without fake tensors: the values are compared)

    runtime = fake_cuda_runtime.install(monkeypatch)
    jf = thunder_rs.jit(fn)
    for _ in range(2):
        logs, results, value = [], [], torch.randn(3)
        for f, eager in ((jf, False), (fn, True)):
            x = value.clone().requires_grad_()
            with _EagerNodes(runtime) if eager else contextlib.nullcontext():
                out = f(x)
            runtime.log = []
            launched = _Launched(runtime, nodes=eager)
            with launched:
                out.backward(torch.ones_like(out))
            logs.append([entry for entry in runtime.log if entry[0] in ("wait", "set_stream")])
            results.append((x.grad, collections.Counter(launched.seen)))
        compiled, ((grad, streams), (expected_grad, expected_streams)) = logs[0], results
        assert streams == expected_streams and torch.equal(grad, expected_grad)
        ran = {s for _, s in expected_streams}  # (the streams eager's backward ran kernels on)
        switched = {e[2] if e[0] == "set_stream" else e[1] for e in compiled}  # (entered, or made to wait)
        assert switched <= ran and (3 in switched) == (3 in ran) == (fn is not _side_block_without_gradients)


def test_calls_under_no_grad_keep_nothing_for_a_backward_they_never_run(monkeypatch):
    """An inference loop (``torch.no_grad()``) of programs making a stream and computing on it:
    their calls have no backward, so the streams they made are not kept on the thread for one
    (each call noted its streams there and nothing took them: the notes of every program the
    loop compiled stayed, holding their last calls' streams). Values as eager's; a call with grad
    after it still runs its backward on the stream it made."""
    import fake_cuda_runtime  # noqa: PLC0415 (without fake tensors: the values are compared)
    from thunder_rs.core.lang import queue_values  # noqa: PLC0415

    runtime = fake_cuda_runtime.install(monkeypatch)
    _Streams(monkeypatch)
    programs = [thunder_rs.jit(_makes_its_stream) for _ in range(3)]
    with torch.no_grad():
        for k in range(30):
            x = torch.randn(3)
            assert torch.equal(programs[k % 3](x), _makes_its_stream(x))
    assert not queue_values._local.__dict__.get("notes")
    compiled = _two_calls_backward_in_turn(programs[0], runtime, False, _on_this_thread)
    for k, out, grad, streams in compiled:
        assert {s for _, s in streams} == {0, f"call {k}"} and grad is not None
    assert not queue_values._local.__dict__.get("notes")
