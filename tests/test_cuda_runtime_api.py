"""The CUDA runtime's API inside the program, as in eager: ``torch.accelerator``'s device index
set, read, entered and synchronized as ``torch.cuda``'s; ``empty_cache()``, ``Event.synchronize()``
of an event made outside and ``Tensor.record_stream`` made again by every call; what the program
asks of the devices (``is_available()``, ``device_count()``, capabilities, properties) guarded, also
through a function bound before tracing (``from torch.cuda import current_device``); and what no
compiled call can make as eager makes it (an event made and returned, an event timed or queried,
the methods of the device-generic ``torch.Event`` and ``torch.Stream``, the allocator's statistics)
refused naming the line (events recorded and waited on and waits between streams are made on every
call: test_cuda_queue.py). On the fake CUDA runtime of two devices
(``fake_cuda``); the GPU twin runs them on real devices (gpu_check).
"""

import pytest
import torch
from torch.cuda import current_device, synchronize as cuda_synchronize

import thunder_rs
from fake_cuda_runtime import Graph, Stream
from thunder_rs.errors import ThunderNotImplementedError

#: a stream and events made outside the programs (an event is made lazily: no GPU wanted)
SIDE = Stream(0, stream_id=3)
EVENT = torch.cuda.Event()
GENERIC_EVENT = torch.Event(device="cuda")
GRAPH = Graph()


def _accelerator_sets(x):
    a = torch.ones(2, device="cuda")
    torch.accelerator.set_device_index(1)
    return x.to("cuda:1") + torch.ones(2, device="cuda"), a, torch.accelerator.current_device_index()


def _accelerator_reads(x):
    return x + torch.ones(torch.accelerator.current_device_index() + 1, 1, device=x.device)


def _accelerator_enters(x):
    with torch.accelerator.device_index(1):
        inner = torch.ones(2, device="cuda") + x.cuda(1)
        torch.accelerator.synchronize()
    torch.accelerator.synchronize()
    return inner, torch.ones(2, device="cuda")


def _bound_before(x):
    y = x + current_device()
    cuda_synchronize()
    return y, torch.ones(2, device=f"cuda:{current_device()}")


def _empties_the_cache(x):
    y = x * 2
    torch.cuda.empty_cache()
    torch.accelerator.empty_cache()
    return y


def _waits_for_an_event(x):
    y = x * 2
    EVENT.synchronize()
    return y


def _records_streams(x):
    x.record_stream(SIDE)
    y = x * 2
    y.record_stream(torch.cuda.current_stream())
    y.record_stream(torch.accelerator.current_stream())
    return y


def _uses_the_default_stream(x):
    torch.cuda.default_stream().synchronize()
    x.record_stream(torch.cuda.default_stream())
    return x * 2


def _asks_the_devices(x):
    if not (torch.cuda.is_available() and torch.accelerator.is_available()):
        return x
    major, minor = torch.cuda.get_device_capability()
    memory = torch.cuda.get_device_properties().total_memory
    sizes = (major, minor + 1, len(torch.cuda.get_device_name()), memory // 2**34)
    if torch.cuda.device_count() > 1 and torch.accelerator.device_count() > 1:
        x = x.double()
    return x, torch.ones(sizes, device=torch.accelerator.current_accelerator())


def _asks_for_dtypes(x):
    half = torch.bfloat16 if torch.cuda.is_bf16_supported(including_emulation=False) else torch.float16
    return x.to(half), x.to(torch.float64 if torch.cuda.is_tf32_supported() else torch.float32)


def _asks_the_device_it_chose(x):
    torch.cuda.set_device(1)
    return x.to(torch.bfloat16 if torch.cuda.is_bf16_supported(False) else torch.float16), torch.ones(2, device="cuda")


#: Programs of a CPU tensor (2,) whose outputs' metadata (fake tensors have no values), current
#: device after the call and runtime log depend on the device current when the call begins and on
#: the devices there are.
PROGRAMS = {
    "accelerator_sets": _accelerator_sets,
    "accelerator_reads": _accelerator_reads,
    "accelerator_enters": _accelerator_enters,
    "bound_before": _bound_before,
    "empties_the_cache": _empties_the_cache,
    "waits_for_an_event": _waits_for_an_event,
    "records_streams": _records_streams,
    "default_stream": _uses_the_default_stream,
    "asks_the_devices": _asks_the_devices,
    "asks_for_dtypes": _asks_for_dtypes,
    "asks_the_device_it_chose": _asks_the_device_it_chose,
}


def _seen(out, x) -> list:
    """What can be compared of outputs and log entries: tensors as their metadata, or as ``x``."""
    if isinstance(out, (tuple, list)):
        return [_seen(item, x) for item in out]
    if isinstance(out, torch.Tensor):
        return "x" if out is x else (out.device, out.dtype, tuple(out.shape))
    return out


@pytest.mark.parametrize("name", PROGRAMS)
def test_the_cuda_runtime_the_program_uses_is_eagers(fake_cuda, name):
    """Calls beginning on devices 0, 1, 0, 0, then with one device: outputs, the current device
    after the call and what the runtime was told, as eager's. (``torch.accelerator``'s calls and
    ``empty_cache`` were made once, while traced, ``Event.synchronize`` too; ``record_stream``
    failed on the stand-in tensor; ``current_device`` bound before tracing and the devices' count
    and capability were read once.)"""
    fn = PROGRAMS[name]
    jf = thunder_rs.jit(fn)
    x = torch.randn(2)
    for start, count in ((0, 2), (1, 2), (0, 2), (0, 2), (0, 1)):
        fake_cuda.count = count
        results = []
        for f in (fn, jf):
            fake_cuda.current, fake_cuda.log = start, []
            out = f(x)
            results.append((_seen(out, x), fake_cuda.current, _seen(fake_cuda.log, x)))
        assert results[1] == results[0]
    assert thunder_rs.cache_misses(jf) <= 3


def _makes_an_event(x):
    start = torch.cuda.Event(enable_timing=True)
    return x * 2, start


def _times(x):
    return x * EVENT.elapsed_time(EVENT)


def _queries(x):
    return x * 2 if EVENT.query() else x


def _takes_an_accelerator_stream(x):
    torch.accelerator.current_stream().synchronize()
    return x * 2


def _captures(x):
    with torch.cuda.graph(GRAPH, stream=SIDE):
        return x * 2


#: Programs whose CUDA calls no compiled call can make as eager makes them: ``(program, the
#: construct named)``. (Events recorded and waited on and waits between streams: test_cuda_queue.py.)
REFUSED = {
    "event_made": (_makes_an_event, "torch.cuda.Event"),
    "elapsed_time": (_times, "torch.cuda.Event.elapsed_time"),
    "event_query": (_queries, "torch.cuda.Event.query"),
    "accelerator_stream": (_takes_an_accelerator_stream, "torch.Stream.synchronize"),
    "generic_record": (lambda x: GENERIC_EVENT.record() or x * 2, "torch.Event.record"),
    "generic_elapsed_time": (lambda x: x * GENERIC_EVENT.elapsed_time(GENERIC_EVENT), "torch.Event.elapsed_time"),
    "generic_synchronize": (lambda x: GENERIC_EVENT.synchronize() or x * 2, "torch.Event.synchronize"),
    "memory_allocated": (lambda x: x * torch.cuda.memory_allocated(), "torch.cuda.memory_allocated"),
    "max_memory_allocated": (lambda x: x * torch.cuda.max_memory_allocated(0), "torch.cuda.max_memory_allocated"),
    "memory_stats": (lambda x: x * len(torch.cuda.memory_stats()), "torch.cuda.memory_stats"),
    "mem_get_info": (lambda x: x * torch.cuda.mem_get_info()[0], "torch.cuda.mem_get_info"),
    "memory_module": (lambda x: x * torch.cuda.memory.memory_reserved(), "torch.cuda.memory.memory_reserved"),
    "accelerator_memory": (lambda x: x * torch.accelerator.memory_allocated(), "torch.accelerator.memory_allocated"),
    "reset_peak": (lambda x: torch.cuda.reset_peak_memory_stats() or x * 2, "torch.cuda.reset_peak_memory_stats"),
    "utilization": (lambda x: x * torch.cuda.utilization(), "torch.cuda.utilization"),
    "graph_replay": (lambda x: GRAPH.replay() or x * 2, "torch.cuda.CUDAGraph.replay"),
    "graph_capture": (_captures, "torch.cuda.graph"),
    "temperature": (lambda x: x * torch.cuda.temperature(0), "torch.cuda.temperature"),
}


@pytest.mark.parametrize("name", REFUSED)
def test_cuda_calls_no_compiled_call_can_make_as_eager_are_refused_naming_the_line(fake_cuda, name):
    """An event made and returned, an event timed or queried, a generic event's or stream's method,
    or the allocator's statistics read or reset: a compiled call would hand back tracing's event,
    and a reading would be reused. (Tracing recorded or read once,
    or failed on the fake runtime's stream with another error.)"""
    fn, construct = REFUSED[name]
    with pytest.raises(
        ThunderNotImplementedError, match=rf"^{construct}: the program .* at .*test_cuda_runtime_api.py:\d+"
    ):
        thunder_rs.jit(fn)(torch.randn(2))


def _records_a_stream_passed_in(x, stream):
    x.record_stream(stream)
    return x * 2


def test_record_stream_of_a_stream_passed_in_takes_each_calls(fake_cuda):
    """The stream is one of the call's arguments, which the entry does not key: each call records
    its own stream, as eager's (the one traced was recorded on every call)."""
    jf, x = thunder_rs.jit(_records_a_stream_passed_in), torch.randn(2)
    for stream in (Stream(0, 3), Stream(0, 5), Stream(1, 5)):
        fake_cuda.log = []
        jf(x, stream)
        assert fake_cuda.log == [("record_stream", x, stream.device_index, stream.stream_id)]


def _asks_whether_capturing(x):
    return x if torch.cuda.is_current_stream_capturing() else x.double()


def test_whether_the_current_stream_captures_is_guarded(fake_cuda):
    """A CUDA graph's capture around the call (the runtime says so): eager takes the other
    branch, and so does the compiled call (its entry was used as traced)."""
    jf, x = thunder_rs.jit(_asks_whether_capturing), torch.randn(2)
    for capturing in (False, True, False):
        fake_cuda.capturing = capturing
        assert jf(x).dtype == _asks_whether_capturing(x).dtype


def test_a_stream_the_accelerator_makes_current_is_refused_naming_the_line(fake_cuda):
    """``torch.accelerator.set_stream(s)``, as ``torch.cuda.set_stream(s)``: the compiled call
    queues its kernels on the stream current when it is called (the setting was made once, while
    traced)."""
    with pytest.raises(ThunderNotImplementedError, match=r"^torch.accelerator.set_stream: .* at .*api.py:\d+"):
        thunder_rs.jit(lambda x: torch.accelerator.set_stream(SIDE) or x * 2)(torch.randn(2))


def _one_device(x):
    torch.accelerator.set_device_index(0)
    with torch.accelerator.device_index(0):
        y = x * torch.accelerator.current_device_index() + 1
        torch.accelerator.synchronize()
    return y, torch.ones(2, device="cuda")


def _records_real_streams(x, side):
    x.record_stream(side)
    y = x * 2
    y.record_stream(torch.cuda.current_stream())
    return y


@pytest.mark.gpu
def test_on_cuda_the_runtime_api_the_program_uses_is_eagers():
    """The GPU twin: values, devices and the current device after each call as eager's (on one
    GPU the programs naming device 0 only; on two, all of them), ``record_stream`` of real streams
    and a recorded event waited on, and the refusals with real events, streams and allocator."""
    two = torch.cuda.device_count() >= 2
    names = ("accelerator_reads", "bound_before", "empties_the_cache", "waits_for_an_event", "asks_the_devices")
    names += ("asks_for_dtypes", "default_stream")
    programs = dict(PROGRAMS if two else {n: PROGRAMS[n] for n in names}, one_device=_one_device)
    programs.pop("records_streams", None)  # (of the fake runtime's stream: ``_records_real_streams`` below)
    x = torch.randn(2, device="cuda")
    EVENT.record()
    for fn in programs.values():
        jf = thunder_rs.jit(fn)
        for start in (0, 1, 0) if two else (0, 0):
            torch.cuda.set_device(start)
            expected = fn(x)
            after = torch.cuda.current_device()
            torch.cuda.set_device(start)
            out = jf(x)
            assert torch.cuda.current_device() == after
            assert _seen(out, x) == _seen(expected, x)
            torch.testing.assert_close(out, expected, rtol=0, atol=0)
    torch.cuda.set_device(0)
    side = torch.cuda.Stream()
    jf = thunder_rs.jit(_records_real_streams)
    for _ in range(2):
        torch.testing.assert_close(jf(x, side), _records_real_streams(x, side), rtol=0, atol=0)
    for fn, construct in REFUSED.values():
        with pytest.raises(ThunderNotImplementedError, match=rf"^{construct}: the program"):
            thunder_rs.jit(fn)(x)
