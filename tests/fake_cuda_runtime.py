"""A fake CUDA runtime of two devices in ``torch._C`` and ``torch.cuda``, for tests on a machine
without a GPU (``conftest``'s ``fake_cuda`` fixture, under ``FakeTensorMode``): the current device,
what the host waited for, what the allocator was told (``empty_cache``, ``record_stream``), in
order, in ``log``; the devices' count and properties the program may ask about. torch's own Python
functions (``torch.cuda.set_device``, ``torch.accelerator.*``, ``torch.cuda.Event``'s methods) run
on it, so eager's program and the compiled one are compared on the same runtime.
"""

import collections
import functools
import types

import torch

Properties = collections.namedtuple("Properties", "name major minor total_memory")


class Runtime:
    """The current device, what happened in order (``log``), how many devices there are and the
    properties of each (tests change them between calls)."""

    def __init__(self):
        self.current, self.log, self.count, self.capturing = 0, [], 2, False
        self.streams: dict = {}  # device index -> the id of its current stream (0 where none was set)
        self.failing = False  # (a wait for an event raises)
        self.properties = [Properties("Fake H200", 9, 0, 2**37), Properties("Fake V100", 7, 0, 2**35)]

    # (kept by the name the first tests read)
    @property
    def synchronized(self):
        return self.log

    @synchronized.setter
    def synchronized(self, value):
        self.log = value

    def exchange(self, index):
        before = self.current
        if index is not None and index >= 0:
            self.current = index
        return before if index is not None and index >= 0 else -1

    def set_device(self, index):
        self.current = index

    def device_properties(self, device=None):
        return self.properties[torch.cuda._utils._get_device_index(device, optional=True)]

    def current_stream(self, device=None):
        index = torch.cuda._utils._get_device_index(device, True)
        return Stream(index, self.streams.get(index, 0))

    def event_wait(self, event, stream=None):
        if self.failing:
            raise RuntimeError("the fake runtime failed to wait")
        self.log.append(("wait_event", id(event), _stream_key(stream)))

    def set_stream(self, stream_id, device_index, device_type):
        self.streams[device_index] = stream_id
        self.log.append(("set_stream", device_index, stream_id))


class Stream:
    """A stream of the fake runtime (a ``torch.cuda.Stream`` wants the driver); its methods are
    ``torch.cuda.Stream``'s, as a real stream's are."""

    def __init__(self, device_index, stream_id=0):
        self.device_index, self.stream_id, self.device_type = device_index, stream_id, 1
        self.device = torch.device("cuda", device_index)

    def __eq__(self, other):
        return isinstance(other, Stream) and self._key() == other._key()

    def _key(self):
        return self.device_index, self.stream_id

    def __hash__(self):
        return hash(self._key())

    # torch.cuda.Stream's methods, looked up when the program takes them (no frame of this module's
    # between the program and them: a refusal names the program's line)
    synchronize = property(lambda self: functools.partial(torch.cuda.Stream.synchronize, self))
    wait_stream = property(lambda self: functools.partial(torch.cuda.Stream.wait_stream, self))
    wait_event = property(lambda self: functools.partial(torch.cuda.Stream.wait_event, self))
    record_event = property(lambda self: functools.partial(torch.cuda.Stream.record_event, self))
    query = property(lambda self: functools.partial(torch.cuda.Stream.query, self))


class Graph:
    """A CUDA graph of the fake runtime (a ``torch.cuda.CUDAGraph`` wants the driver); its methods
    are ``torch.cuda.CUDAGraph``'s."""

    replay = property(lambda self: functools.partial(torch.cuda.CUDAGraph.replay, self))
    capture_begin = property(lambda self: functools.partial(torch.cuda.CUDAGraph.capture_begin, self))


def _stream_key(stream=None):
    """A stream's ``(device, id)``; the current one's where None (``Event.record()``'s)."""
    stream = stream or torch.cuda.current_stream()
    return stream.device_index, stream.stream_id


class Nvtx:
    """``torch.cuda.nvtx``'s C functions, logging what is pushed, popped and marked."""

    def __init__(self, log):
        self.log, self.depth = log, 0

    def rangePushA(self, msg):  # noqa: N802 (torch's names)
        self.log(("range_push", msg))
        self.depth += 1
        return self.depth - 1

    def rangePop(self):  # noqa: N802
        self.log(("range_pop",))
        self.depth -= 1
        return self.depth

    def markA(self, msg):  # noqa: N802
        self.log(("mark", msg))

    def rangeStartA(self, msg):  # noqa: N802
        self.log(("range_start", msg))
        return 7

    def rangeEnd(self, handle):  # noqa: N802
        self.log(("range_end", handle))


def install(monkeypatch) -> Runtime:
    """Puts a fresh runtime in (``monkeypatch`` takes it out after the test)."""
    runtime = Runtime()
    log = lambda *entry: runtime.log.append(entry)  # noqa: E731
    for holder, name, value in (
        (torch.cuda, "is_initialized", lambda: True),
        (torch.cuda, "is_available", lambda: runtime.count > 0),
        (torch.cuda, "device_count", lambda: runtime.count),
        (torch.cuda, "_check_stray_context", lambda index: None),
        (torch.cuda, "get_device_properties", runtime.device_properties),
        (torch._C, "_cuda_getDevice", lambda: runtime.current),
        (torch._C, "_cuda_setDevice", runtime.set_device),
        (torch.cuda, "_exchange_device", runtime.exchange),
        (torch.cuda, "_maybe_exchange_device", runtime.exchange),
        (torch._C, "_cuda_synchronize", lambda: log("device", runtime.current)),
        (torch._C, "_cuda_emptyCache", lambda: log("empty_cache", runtime.current)),
        (torch._C, "_accelerator_isAllocatorInitialized", lambda: True),
        (torch._C, "_accelerator_emptyCache", lambda: log("empty_cache", runtime.current)),
        (torch.cuda, "current_stream", runtime.current_stream),
        (torch.cuda, "default_stream", lambda device=None: Stream(torch.cuda._utils._get_device_index(device, True))),
        (torch._C, "_cuda_setStream", runtime.set_stream),
        (torch._C, "_accelerator_getAccelerator", lambda: torch.device("cuda")),
        (torch._C, "_accelerator_getDeviceIndex", lambda: runtime.current),
        (torch._C, "_accelerator_setDeviceIndex", runtime.set_device),
        (torch._C, "_accelerator_exchangeDevice", runtime.exchange),
        (torch._C, "_accelerator_maybeExchangeDevice", runtime.exchange),
        (torch._C, "_accelerator_synchronizeDevice", lambda index: log("device", index)),
        (
            torch._C,
            "_accelerator_getStream",
            lambda index: torch.Stream(stream_id=0, device_index=index, device_type=1),
        ),
        (torch.cuda.Stream, "synchronize", lambda self: log("stream", self.device_index)),
        (torch.cuda.Stream, "wait_stream", lambda self, other: log("wait", self.stream_id, other.stream_id)),
        (torch.cuda.Event, "synchronize", lambda self: log("event", id(self))),
        (torch.cuda.Event, "record", lambda self, s=None: log("record", id(self), _stream_key(s))),
        (torch.cuda.Event, "wait", lambda self, s=None: runtime.event_wait(self, s)),
        (torch.cuda.Stream, "wait_event", lambda self, e: log("wait_event", id(e), _stream_key(self))),
        (torch.cuda.nvtx, "_nvtx", Nvtx(lambda entry: runtime.log.append(entry))),
        (torch.cuda.graphs, "_cuda_isCurrentStreamCapturing", lambda: runtime.capturing),
        (torch.Tensor, "record_stream", lambda self, s: log("record_stream", self, s.device_index, s.stream_id)),
    ):
        monkeypatch.setattr(holder, name, value, raising=False)
    return runtime


# -- the runtime is no part of the program -----------------------------------------------------------

#: The file name the runtime's code runs under: a frozen module's, whose reads and writes the
#: observer does not take for the program's, as it takes none of the real runtime's (C code). Else
#: a guard on ``Runtime.count`` or a write to ``Runtime.log`` would be found where eager's program
#: reads and writes no Python state at all, and would hide what the stand-ins do.
FILENAME = "<frozen fake_cuda_runtime>"


def _frozen(code: types.CodeType) -> types.CodeType:
    consts = tuple(_frozen(c) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    return code.replace(co_filename=FILENAME, co_consts=consts)


def _freeze(function) -> None:
    if isinstance(function, types.FunctionType):
        function.__code__ = _frozen(function.__code__)
    elif isinstance(function, property):
        for accessor in (function.fget, function.fset):
            _freeze(accessor)


for _value in list(globals().values()):
    if isinstance(_value, type) and _value.__module__ == __name__:
        for _member in vars(_value).values():
            _freeze(_member)
    elif isinstance(_value, types.FunctionType) and _value.__module__ == __name__ and _value is not _freeze:
        _freeze(_value)
