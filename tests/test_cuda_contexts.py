"""The current CUDA device and stream set, read or synchronized inside the program, as in eager:
``torch.cuda.set_device(i)`` and ``with torch.cuda.device(i)`` make the tensors made on ``cuda``
after them (inside it) go to ``cuda:i``, ``set_device`` is made again by every call, the current
device the program reads is guarded, ``torch.cuda.synchronize()`` and
``current_stream().synchronize()`` are made again by every call, and ``torch.cuda.set_stream`` is
refused naming the line (``with torch.cuda.stream(s)``: test_cuda_queue.py). On fake CUDA tensors
(``FakeTensorMode``) with a fake CUDA runtime of two devices (``fake_cuda``: ``fake_cuda_runtime``);
the GPU twin runs the same programs on real devices (gpu_check).
"""

import pytest
import torch

import thunder_rs
from fake_cuda_runtime import Stream as _Stream
from thunder_rs.errors import ThunderNotImplementedError


def _set_then_make(x):
    a = torch.ones(2, device="cuda")
    torch.cuda.set_device(1)
    return x.to("cuda:1") + torch.ones(2, device="cuda"), a, torch.zeros(2, device="cuda")


def _inside_device(x):
    with torch.cuda.device(1):
        inner = torch.ones(2, device="cuda") + x.cuda(1)
    return inner, torch.ones(2, device="cuda")


def _device_of(x):
    y = torch.ones(2, device="cuda:1")
    with torch.cuda.device_of(y):
        return y + torch.arange(2, device="cuda")


def _reads_current_device(x):
    return x + torch.cuda.current_device(), torch.ones(2, device=f"cuda:{torch.cuda.current_device()}")


def _synchronizes(x):
    y = x * 2
    torch.cuda.synchronize()
    with torch.cuda.device(1):
        torch.cuda.synchronize()
    torch.cuda.current_stream().synchronize()
    return y


#: Programs of a CPU tensor (2,): what they make on ``cuda`` depends on the current device.
PROGRAMS = {
    "set_device": _set_then_make,
    "device_context": _inside_device,
    "device_of": _device_of,
    "current_device": _reads_current_device,
    "synchronize": _synchronizes,
}


def _metadata(out):
    return [(t.device, t.dtype, tuple(t.shape)) for t in out] if isinstance(out, tuple) else _metadata((out,))


@pytest.mark.parametrize("name", PROGRAMS)
def test_the_current_cuda_device_the_program_sets_or_reads_is_eagers(fake_cuda, name):
    """Calls beginning on ``cuda:0``, ``cuda:1`` and ``cuda:0`` again: each output's device, the
    current device after the call and what was synchronized, as eager's. (``set_device`` was
    made once, while traced, and ``cuda`` after it was the device current when the call began;
    a device context's tensors were traced on the device the call began on and the entry guarded
    that device, compiling again on every call; ``current_device()`` was read once.)"""
    fn = PROGRAMS[name]
    jf = thunder_rs.jit(fn)
    x = torch.randn(2)
    for start in (0, 1, 0, 0):
        results = []
        for f in (fn, jf):
            fake_cuda.current, fake_cuda.synchronized = start, []
            out = f(x)
            results.append((_metadata(out), fake_cuda.current, fake_cuda.synchronized))
        assert results[1] == results[0]
    assert thunder_rs.cache_misses(jf) <= 2


def test_a_device_context_compiles_once(fake_cuda):
    """The tensors made inside ``with torch.cuda.device(1)`` depend on no state the call begins
    with: a program making none elsewhere is compiled once, whatever device is current."""
    jf = thunder_rs.jit(_only_inside_device)
    for start in (0, 1, 0):
        fake_cuda.current = start
        assert jf(torch.randn(2)).device == torch.device("cuda:1")
    assert thunder_rs.cache_misses(jf) == 1


def _only_inside_device(x):
    with torch.cuda.device(1):
        return torch.ones(2, device="cuda") + x.cuda(1)


def _sets_stream(x):
    torch.cuda.set_stream(_Stream(0, stream_id=3))
    return x * 2


def test_a_stream_made_current_in_the_program_is_refused_naming_the_line(fake_cuda):
    """``torch.cuda.set_stream(s)`` leaves ``s`` current after the call, which a compiled call would
    not make (``with torch.cuda.stream(s)`` switches and back on every call: test_cuda_queue.py)."""
    with pytest.raises(ThunderNotImplementedError, match=r"another CUDA stream current at .*test_cuda_contexts.py:\d+"):
        thunder_rs.jit(_sets_stream)(torch.randn(2))
    assert thunder_rs.jit(lambda x: _noop_stream(x))(torch.randn(2)).shape == (2,)


def _noop_stream(x):
    with torch.cuda.stream(None):  # (eager's no-op)
        return x * 2


@pytest.mark.gpu
def test_on_cuda_the_current_device_the_program_sets_or_reads_is_eagers():
    """The GPU twin: values, devices, pinned memory, and the current device after each call as
    eager's (on one GPU, the programs naming device 0 only; on two, all of them); a non-blocking
    copy back to the host is pinned as eager's, and a stream the program makes and enters as eager's."""
    two = torch.cuda.device_count() >= 2
    programs = dict(PROGRAMS if two else {}, one_device=_one_device, synchronizes_one=_synchronizes_one)
    programs["copies_back"] = _copies_back
    programs["in_real_stream"] = _in_real_stream
    x = torch.randn(2, device="cuda")
    for fn in programs.values():
        jf = thunder_rs.jit(fn)
        for start in (0, 1, 0) if two else (0, 0):
            torch.cuda.set_device(start)
            expected = fn(x)
            after = torch.cuda.current_device()
            torch.cuda.set_device(start)
            out = jf(x)
            assert torch.cuda.current_device() == after
            assert _metadata(out) == _metadata(expected)
            torch.testing.assert_close(out, expected, rtol=0, atol=0)
            pinned = [t.is_pinned() for t in (out if isinstance(out, tuple) else (out,))]
            assert pinned == [t.is_pinned() for t in (expected if isinstance(expected, tuple) else (expected,))]
    torch.cuda.set_device(0)


def _one_device(x):
    torch.cuda.set_device(0)
    with torch.cuda.device(0):
        y = torch.ones(2, device="cuda") * torch.cuda.current_device()
    return x.to("cuda", non_blocking=True) + y


def _synchronizes_one(x):
    y = x * 2
    torch.cuda.synchronize()
    torch.cuda.current_stream().synchronize()
    return y + 1


def _copies_back(x):
    y = (x * 2).to("cpu", non_blocking=True)  # (eager's is pinned, its copy asynchronous)
    torch.cuda.synchronize()
    return y, x.to("cuda", non_blocking=True) + 1


def _in_real_stream(x):
    with torch.cuda.stream(torch.cuda.Stream()):
        return x * 2


#: Programs pinning host memory: whether a storage is pinned is no part of a trace.
PINNING = {
    "pin_memory": lambda x: x.pin_memory() * 2,
    "empty_copy": lambda x: torch.empty(3, pin_memory=True).copy_(x),
    "ones_added": lambda x: torch.ones(3, pin_memory=True) + x,
    "zeros_like": lambda x: torch.zeros_like(x, pin_memory=True),
}


@pytest.mark.parametrize("name", PINNING)
def test_pinning_host_memory_in_the_program_is_refused_naming_the_line(name):
    """Eager pins (or, without a GPU, raises); the copy into a pinned ``empty`` compiled to a
    clone in pageable memory (and computed on this machine where eager raises), ``ones + x``
    handed on the pinned buffer it wrote in place where eager's sum is pageable, and
    ``pin_memory()`` raised 'cannot pin MetaFloatType' at compile time."""
    with pytest.raises(ThunderNotImplementedError, match=r"at .*test_cuda_contexts.py:\d+: pins host memory"):
        thunder_rs.jit(PINNING[name])(torch.randn(3))
