"""Work the program puts on the device queue between its kernels, made at that point of every call,
as eager makes it: waits between streams and events, events made, recorded, waited on and
synchronized, ``with torch.cuda.stream(s)``, and nvtx ranges and marks (``cuda_queue``). On the
fake CUDA runtime of two devices (``fake_cuda``), whose log holds what the runtime was told, and the
kernels launched (``_Kernels``), in order; the GPU twin runs them on real devices (gpu_check).
"""

import collections
import contextlib
import re

import pytest
import torch
from torch import Event
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

import thunder_rs
from fake_cuda_runtime import Stream
from thunder_rs.errors import ThunderNotImplementedError
from thunder_rs.executors import FusionExecutor
from thunder_rs.executors.torch_ex import torch_ex

#: a stream and an event made outside the programs (an event is made lazily: no GPU wanted)
SIDE = Stream(0, stream_id=3)
EVENT = torch.cuda.Event()


class _Kernels(TorchDispatchMode):
    """Logs the kernels of ``sin`` and ``cos`` (in place or not) into the runtime's log, as launched."""

    def __init__(self, runtime):
        super().__init__()
        self.runtime = runtime

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__.rstrip("_")
        if name in ("sin", "cos"):
            self.runtime.log.append(("kernel", name))
        return func(*args, **(kwargs or {}))


def _waits_between_streams(x):
    torch.cuda.current_stream().wait_stream(SIDE)
    y = x.sin()
    SIDE.wait_stream(torch.cuda.current_stream())
    return y.cos()


def _makes_events(x):
    done = torch.cuda.Event(enable_timing=True)
    y = x.sin()
    done.record()
    SIDE.wait_event(done)
    other = torch.cuda.Event()
    other.record(SIDE)
    other.wait()
    z = y.cos()
    done.synchronize()
    return z


def _records_an_outside_event(x):
    y = x.sin()
    EVENT.record()
    EVENT.wait(SIDE)
    return y.cos()


def _records_on_a_stream(x):
    y = x.sin()
    made = SIDE.record_event()
    torch.cuda.current_stream().wait_event(made)
    return y.cos()


def _on_a_side_stream(x):
    y = x.sin()
    with torch.cuda.stream(SIDE):
        EVENT.record()
        z = y.cos()
        torch.cuda.current_stream().wait_stream(torch.cuda.default_stream())
    return z.sin()


def _nvtx_ranges(x):
    torch.cuda.nvtx.range_push("forward")
    y = x.sin()
    with torch.cuda.nvtx.range("step {} of {}", 1, 2):
        torch.cuda.nvtx.mark("inside")
        z = y.cos()
    torch.cuda.nvtx.range_pop()
    return z


#: Programs of a CPU tensor (2,) whose runtime log (kernels, waits, events, streams made current,
#: nvtx ranges) depends on the device current when the call begins.
PROGRAMS = {
    "waits_between_streams": _waits_between_streams,
    "makes_events": _makes_events,
    "records_an_outside_event": _records_an_outside_event,
    "records_on_a_stream": _records_on_a_stream,
    "on_a_side_stream": _on_a_side_stream,
    "nvtx_ranges": _nvtx_ranges,
}


def _seen(log: list) -> list:
    """The log with events named by their order of appearance in it (``EVENT`` by its name): a
    program's event is made anew on every call, in eager and compiled alike."""
    names: dict = {id(EVENT): "EVENT"}
    seen = []
    for entry in log:
        if entry[0] in ("record", "wait_event", "event"):
            entry = (entry[0], names.setdefault(entry[1], f"event{len(names)}"), *entry[2:])
        seen.append(entry)
    return seen


def _calls(fake_cuda, fn, x, starts=(0, 1, 0)) -> list:
    logs = []
    for start in starts:
        fake_cuda.current, fake_cuda.log, fake_cuda.streams = start, [], {}
        with _Kernels(fake_cuda):
            fn(x)
        logs.append((_seen(fake_cuda.log), fake_cuda.current, dict(fake_cuda.streams)))
    return logs


@pytest.mark.parametrize("name", PROGRAMS)
def test_the_device_queue_work_of_the_program_is_eagers_on_every_call(fake_cuda, name):
    """Calls beginning on devices 0, 1, 0: the waits, events, stream switches and nvtx ranges, with
    their streams and events, between the kernels eager's fall between, on every call. (Events
    made, recorded or waited on and waits between streams were refused; nvtx ranges were pushed
    once, while traced; ``with torch.cuda.stream`` was refused.)"""
    fn = PROGRAMS[name]
    jf = thunder_rs.jit(fn)
    x = torch.randn(2)
    expected = _calls(fake_cuda, fn, x)
    assert _calls(fake_cuda, jf, x) == expected
    assert any(entry[0] != "kernel" for log in expected for entry in log[0])
    assert thunder_rs.cache_misses(jf) <= 2


class _Fuser(FusionExecutor):
    """Fuses what the torch executor runs: its regions would launch their kernels together."""

    def __init__(self):
        super().__init__("queue_test_fuser")
        self.take_from(torch_ex, list(torch_ex.registry))

    def fuse(self, region):
        return region.function


def test_a_program_waiting_on_the_device_queue_launches_its_kernels_one_by_one(fake_cuda):
    """With a fusion executor: the kernels before and after each wait are launched where eager
    launches them (a region of ``sin`` and ``cos`` launched them both before the waits)."""
    for fn in (_makes_events, _on_a_side_stream):
        jf = thunder_rs.jit(fn, executors=[_Fuser()])
        x = torch.randn(2)
        assert _calls(fake_cuda, jf, x) == _calls(fake_cuda, fn, x)
        assert not thunder_rs.last_traces(jf)[-1].regions()


def _pushes_a_range(x):
    torch.cuda.nvtx.range_push("a")
    return (x.sin() * 2).cos()


def test_nvtx_ranges_keep_the_fusion_executors(fake_cuda):
    """A range or mark does not order kernels: a program with only those still fuses, and every
    call pushes and pops (the ranges were pushed once, while traced)."""
    jf = thunder_rs.jit(_pushes_a_range, executors=[_Fuser()])
    for _ in range(2):
        fake_cuda.log = []
        jf(torch.randn(2))
        assert fake_cuda.log == [("range_push", "a")]
    assert thunder_rs.last_traces(jf)[-1].regions()


def _returns_the_nvtx_depth(x):
    depth = torch.cuda.nvtx.range_push("a")
    torch.cuda.nvtx.range_pop()
    return x * 2, depth


def _keeps_the_nvtx_depth(x):
    torch.cuda.nvtx.range_push("a")
    HOLDER.depth = torch.cuda.nvtx.range_pop()
    return x * 2


def _returns_its_event(x):
    done = torch.cuda.Event()
    done.record()
    return x * 2, done


class _Holder:
    event = None
    depth = None


HOLDER = _Holder()


def _keeps_its_event(x):
    HOLDER.event = torch.cuda.Event()
    HOLDER.event.record()
    return x * 2


def _returns_a_generic_event(x):
    done = torch.Event()
    assert isinstance(done, torch.Event) and issubclass(type(done), torch.Event)
    return x * 2, [done]


def _keeps_an_imported_generic_event(x):
    HOLDER.event = Event(enable_timing=True)
    return x * 2


def _waits_for_a_stream_passed_in(x, stream):
    torch.cuda.current_stream().wait_stream(stream)
    return x * 2


def _writes_its_input_on_a_side_stream(x):
    with torch.cuda.stream(SIDE):
        x.add_(1)
    return x * 2


#: Programs whose device-queue work no compiled call can make as eager makes it: ``(program, its
#: arguments past the tensor, the construct named, the line named: its text)``.
REFUSED = {
    "event_returned": (_returns_its_event, (), "torch.cuda.Event", "done = torch.cuda.Event()"),
    "event_kept": (_keeps_its_event, (), "torch.cuda.Event", "HOLDER.event = torch.cuda.Event()"),
    "generic_event_returned": (_returns_a_generic_event, (), "torch.Event", "done = torch.Event()"),
    "generic_event_kept": (
        _keeps_an_imported_generic_event,
        (),
        "torch.Event",
        "HOLDER.event = Event(enable_timing=True)",
    ),
    "stream_passed_in": (
        _waits_for_a_stream_passed_in,
        (SIDE,),
        "torch.cuda.Stream.wait_stream",
        "torch.cuda.current_stream().wait_stream(stream)",
    ),
    "input_written_on_a_stream": (
        _writes_its_input_on_a_side_stream,
        (),
        "with torch.cuda.stream(...)",
        "with torch.cuda.stream(SIDE):",
    ),
    "nvtx_tensor_text": (
        lambda x: torch.cuda.nvtx.range_push(f"{x}") or x * 2,
        (),
        "torch.cuda.nvtx.range_push",
        "lambda x: torch.cuda.nvtx.range_push",
    ),
    "nvtx_depth_used": (
        lambda x: torch.cuda.nvtx.range_push("a") or x * 2,
        (),
        "torch.cuda.nvtx.range_push",
        'lambda x: torch.cuda.nvtx.range_push("a") or x * 2',
    ),
    "nvtx_depth_returned": (
        _returns_the_nvtx_depth,
        (),
        "torch.cuda.nvtx.range_push",
        'depth = torch.cuda.nvtx.range_push("a")',
    ),
    "nvtx_depth_kept": (_keeps_the_nvtx_depth, (), "torch.cuda.nvtx.range_pop", "HOLDER.depth = torch.cuda.nvtx"),
    "nvtx_range_start": (
        lambda x: torch.cuda.nvtx.range_end(torch.cuda.nvtx.range_start("a")) or x * 2,
        (),
        "torch.cuda.nvtx.range_start",
        "torch.cuda.nvtx.range_end(torch.cuda.nvtx.range_start",
    ),
}


@pytest.mark.parametrize("name", REFUSED)
def test_device_queue_work_no_compiled_call_can_make_as_eager_is_refused_naming_the_line(fake_cuda, name):
    """An event the program makes and returns or keeps (eager's is new on every call; a compiled
    call would hand back tracing's: also a ``torch.Event``, whose C type no ``__new__`` stand-in
    could change, which was handed back as tracing's), a stream passed in (the entry is not keyed on it), nvtx text of
    a tensor, a range handle and the depth ``range_push``/``range_pop`` return, used, returned or
    kept (values of the call's run), and an input written inside a stream context (the compiled
    call copies it back after running, on the stream current then). (The event was returned as
    tracing's; the stream's wait was refused as a mark among kernels; the ranges were pushed once;
    the depth was None, where eager's is an int; the stream context was refused.)"""
    fn, args, construct, text = REFUSED[name]
    with pytest.raises(
        ThunderNotImplementedError, match=rf"^{re.escape(construct)}: .* at .*test_cuda_queue.py:\d+"
    ) as e:
        thunder_rs.jit(fn)(torch.randn(2), *args)
    line = int(e.value.args[0].split("test_cuda_queue.py:")[1].split(";")[0].split()[0])
    assert text in open(__file__).read().splitlines()[line - 1]


#: the real side stream of the GPU twin (made there)
REAL_SIDE: list = []


def _real_queue_work(x):
    side = REAL_SIDE[0]
    torch.cuda.current_stream().wait_stream(side)
    y = x.sin()
    done = torch.cuda.Event(enable_timing=True)
    done.record()
    with torch.cuda.stream(side):
        side.wait_event(done)
        z = (y * 2).cos()
        torch.cuda.nvtx.range_push("side")
        torch.cuda.nvtx.range_pop()
    torch.cuda.current_stream().wait_stream(side)
    done.synchronize()
    return z + y


@pytest.mark.gpu
def test_on_cuda_the_device_queue_work_of_the_program_is_eagers():
    """The GPU twin: a program waiting between real streams and on an event it makes, computing on
    a side stream inside ``with torch.cuda.stream``, gives eager's values on every call (the side
    stream's kernels wait for the main stream's); ``with torch.Stream`` is refused naming the line
    and leaves the stream as it was."""
    side = torch.cuda.Stream()
    REAL_SIDE[:] = [side]
    jf = thunder_rs.jit(_real_queue_work)
    x = torch.randn(1 << 20, device="cuda")
    for _ in range(3):
        torch.testing.assert_close(jf(x), _real_queue_work(x), rtol=0, atol=0)
    assert not thunder_rs.last_traces(jf)[-1].regions()

    def enters(x):
        with side:
            return x * 2

    with pytest.raises(ThunderNotImplementedError, match=r"^with torch.Stream\(...\): .* at .*test_cuda_queue.py:\d+"):
        thunder_rs.jit(enters)(x)
    assert torch.cuda.current_stream() == torch.cuda.default_stream()


def _enters_a_generic_stream(x):
    with CPU_STREAM:
        y = x * 2
    return y


CPU_STREAM = torch.Stream(device="cpu")


def test_a_generic_stream_entered_is_refused_naming_the_line(monkeypatch):
    """``with torch.Stream(...)``: its C ``__enter__`` made the stream current while traced, which
    a compiled call would not make (its kernels would run on the stream current when it is called);
    refused where its ``__exit__`` is called, after leaving the stream. A CPU stream stands for the
    accelerator's (``current_accelerator`` says the CPU). (The block was traced as if on the
    current stream.)"""
    monkeypatch.setattr(torch._C, "_accelerator_getAccelerator", lambda: torch.device("cpu"))
    with pytest.raises(
        ThunderNotImplementedError, match=r"^with torch.Stream\(...\): .* at .*test_cuda_queue.py:(\d+)"
    ) as e:
        thunder_rs.jit(_enters_a_generic_stream)(torch.randn(2))
    line = int(e.value.args[0].split("test_cuda_queue.py:")[1].split(";")[0])
    assert open(__file__).read().splitlines()[line - 1].strip() == "with CPU_STREAM:"


def _fails_on_a_side_stream(x):
    with torch.cuda.stream(SIDE):
        y = x.sin()
        EVENT.wait()
    return y.cos()


def test_a_call_raising_inside_a_stream_context_leaves_the_stream_as_eager(fake_cuda):
    """A call whose wait fails inside ``with torch.cuda.stream(s)``: eager's ``with`` makes the
    stream current before it current again on the way out, and so does the compiled call (``s`` was
    left current)."""
    jf, x = thunder_rs.jit(_fails_on_a_side_stream), torch.randn(2)
    jf(x)
    fake_cuda.failing = True
    for f in (_fails_on_a_side_stream, jf):
        fake_cuda.streams = {}
        with pytest.raises(RuntimeError, match="the fake runtime failed to wait"):
            f(x)
        assert fake_cuda.streams == {0: 0}


def _reads_a_value_first(x):
    y = x.sin()
    if y.sum() > 0:  # (tracing runs the recording so far to read it)
        y = y.cos()
    torch.cuda.nvtx.range_push("read")
    torch.cuda.current_stream().wait_stream(SIDE)
    with torch.cuda.stream(SIDE):
        EVENT.record()
        z = y.sin()
    torch.cuda.nvtx.range_pop()
    return z


def test_a_program_reading_a_value_makes_its_queue_work_once_on_every_call(monkeypatch):
    """Real values read while traced, the last call taking the other branch: every call, the first
    too, waits, records, switches and pushes once, as eager. (The first call made none: its outputs
    were those tracing computed, where the effects were made while tracing.)"""
    import fake_cuda_runtime  # noqa: PLC0415 (without fake tensors: the values are read)

    runtime = fake_cuda_runtime.install(monkeypatch)
    jf = thunder_rs.jit(_reads_a_value_first)
    for x in (torch.ones(2), torch.ones(2), -torch.ones(2)):
        seen = []
        for f in (_reads_a_value_first, jf):
            runtime.log, runtime.streams = [], {}
            out = f(x)
            seen.append((out, _seen(runtime.log), runtime.streams))
        torch.testing.assert_close(seen[1][0], seen[0][0])
        assert seen[1][1:] == seen[0][1:]


def _reads_a_value_after_a_wait(x):
    torch.cuda.current_stream().wait_stream(SIDE)
    y = x.sin()
    if y.sum() > 0:
        y = y.cos()
    return y


def test_a_value_read_after_a_wait_is_refused_naming_the_line(monkeypatch):
    """A call finding another value at the read runs the program again from its start: the wait
    before it would be made twice. (Tracing made the wait, and the first call again.)"""
    import fake_cuda_runtime  # noqa: PLC0415 (without fake tensors: the values are read)

    fake_cuda_runtime.install(monkeypatch)
    with pytest.raises(
        ThunderNotImplementedError,
        match=r"^torch.cuda.Stream.wait_stream: the program reads a tensor's value at .*test_cuda_queue.py:(\d+)",
    ) as e:
        thunder_rs.jit(_reads_a_value_after_a_wait)(torch.ones(2))
    line = int(e.value.args[0].split("test_cuda_queue.py:")[1].split(" ")[0])
    assert open(__file__).read().splitlines()[line - 1].strip() == "if y.sum() > 0:"


#: the kernels whose streams the backward tests compare (the loss's and autograd's own are left out)
_COMPUTED = ("sin", "cos", "neg", "mul", "exp")


class _EagerNodes(TorchFunctionMode):
    """Notes on each autograd node made the stream its forward ran on (eager's autograd runs its
    backward there)."""

    def __init__(self, stream_now):
        super().__init__()
        self.stream_now = stream_now

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.grad_fn is not None and "stream" not in t.grad_fn.metadata:
                t.grad_fn.metadata["stream"] = self.stream_now()
        return out


class _BackwardStreams(TorchDispatchMode):
    """``(kernel, stream)`` of each of ``_COMPUTED`` launched: the stream current, or with ``rule``,
    the one eager's autograd runs the node being run on (what ``_EagerNodes`` noted)."""

    def __init__(self, stream_now, rule=False):
        super().__init__()
        self.stream_now, self.rule, self.seen = stream_now, rule, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__.rstrip("_")
        if name in _COMPUTED:
            node = torch._C._current_autograd_node() if self.rule else None
            self.seen.append((name, node.metadata["stream"] if node is not None else self.stream_now()))
        return func(*args, **(kwargs or {}))


def _backward_streams(fn, x, stream_now, rule=False):
    """``fn(x)``'s output and ``x``'s gradient, and the streams of the backward's kernels (in eager,
    ``rule``: eager autograd's rule)."""
    x = x.detach().requires_grad_()
    with _EagerNodes(stream_now) if rule else contextlib.nullcontext():
        out = fn(x)
    with _BackwardStreams(stream_now, rule) as seen:
        out.backward(torch.ones_like(out))
    return out.detach(), x.grad, collections.Counter(seen.seen)


def _computes_on_a_side_stream(x):
    y = x.sin()
    with torch.cuda.stream(SIDE):
        z = y.cos()
        w = z.exp()
    return w * y


def _starts_on_a_side_stream(x):
    with torch.cuda.stream(SIDE):
        y = x.sin()
    return y.cos()


@pytest.mark.parametrize("fn", [_computes_on_a_side_stream, _starts_on_a_side_stream])
def test_the_backward_of_a_block_on_a_stream_runs_on_that_stream_as_eagers(monkeypatch, fn):
    """Each backward kernel is launched on the stream eager's autograd runs it on: its forward's,
    inside ``with torch.cuda.stream(s)`` that stream, with eager's values and gradients (the
    compiled backward ran all of them on the stream current when ``backward`` was called)."""
    import fake_cuda_runtime  # noqa: PLC0415 (without fake tensors: the values are compared)

    fake_cuda = fake_cuda_runtime.install(monkeypatch)
    jf = thunder_rs.jit(fn)
    stream_now = lambda: fake_cuda.streams.get(0, 0)  # noqa: E731
    for _ in range(2):
        x = torch.randn(3)
        out, grad, streams = _backward_streams(jf, x, stream_now)
        expected_out, expected_grad, expected = _backward_streams(fn, x, stream_now, rule=True)
        assert streams == expected and {s for _, s in expected} == {0, 3}
        assert torch.equal(out, expected_out) and torch.equal(grad, expected_grad)
        assert fake_cuda.streams == {0: 0}


@pytest.mark.gpu
def test_on_cuda_the_backward_of_a_block_on_a_stream_runs_on_that_stream_as_eagers():
    """The GPU twin: the compiled backward's kernels of a block computed on a real side stream (one
    the program reads, and one it makes on every call) run on that stream, as eager's autograd runs
    them (on its device thread), with eager's values and gradients."""
    side = torch.cuda.Stream()

    def on_the_side(x):
        y = x.sin()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            z = (y.cos()).exp()
        torch.cuda.current_stream().wait_stream(side)
        return z * y

    def on_its_own_stream(x):
        made = torch.cuda.Stream()
        made.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(made):
            y = x.sin().exp()
        torch.cuda.current_stream().wait_stream(made)
        return y.cos()

    on_the_default = lambda: torch.cuda.current_stream() == torch.cuda.default_stream()  # noqa: E731
    for fn in (on_the_side, on_its_own_stream):
        jf = thunder_rs.jit(fn)
        for _ in range(3):
            x = torch.randn(1 << 20, device="cuda")
            out, grad, streams = _backward_streams(jf, x, on_the_default)
            expected_out, expected_grad, expected = _backward_streams(fn, x, on_the_default)
            torch.cuda.synchronize()
            assert streams == expected and {s for _, s in expected} == {True, False}
            torch.testing.assert_close(out, expected_out, rtol=0, atol=0)
            torch.testing.assert_close(grad, expected_grad, rtol=0, atol=0)


def test_a_stream_the_program_makes_is_the_one_a_backward_on_another_thread_enters():
    """A backward entering a stream the program made runs on autograd's device thread, which made
    none: it takes the one the call made (an AttributeError, the thread's own being absent); a
    thread's own call takes its own."""
    import threading  # noqa: PLC0415

    from thunder_rs.core.acquisition.cuda_queue import Made  # noqa: PLC0415

    made = Made(list, {}, "here")
    made.make()
    seen: list = []
    thread = threading.Thread(target=lambda: seen.append(made.value()))
    thread.start()
    thread.join()
    assert seen[0] is made.value() and seen[0] is made.last

    def its_own() -> None:
        made.make()
        seen.append(made.value())

    thread = threading.Thread(target=its_own)
    thread.start()
    thread.join()
    assert seen[1] is made.last and seen[1] is not seen[0]
