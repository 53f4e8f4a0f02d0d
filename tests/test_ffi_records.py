"""The records that cross the FFI (issue 25): frozen, read by name, compared by value, and
holding what eager PyTorch computes."""

import pytest
import torch

import thunder_rs
from thunder_rs import _core, prims
from thunder_rs.core.base.dtypes import CODES, DTYPES
from thunder_rs.core.lang.recorder import input_proxy, recording
from thunder_rs.executors import FusionExecutor
from thunder_rs.executors.torch_ex import torch_ex


def _recorded_add(x: torch.Tensor, y: torch.Tensor) -> list:
    rec = _core.Recorder()
    with recording(rec):
        a, b = input_proxy(rec, x), input_proxy(rec, y)
        return rec.prim("add", (a, b), True)


def test_a_recorded_prim_describes_eager_s_result():
    x, y = torch.randn(3, 4, requires_grad=True), torch.randn(3, 4)
    (out,) = _recorded_add(x, y)
    eager = x + y
    assert isinstance(out, _core.RecordedTensor) and out.vid == 2
    assert (out.shape, DTYPES[out.dtype_code], out.device) == (tuple(eager.shape), eager.dtype, str(eager.device))
    assert out.requires_grad == eager.requires_grad
    assert out == _recorded_add(x, y)[0] and hash(out) == hash(_recorded_add(x, y)[0])
    assert (
        repr(out)
        == "RecordedTensor(vid=2, shape=(3, 4), dtype_code=%d, device='cpu', requires_grad=True)"
        % (CODES[torch.float32])
    )


def test_records_are_frozen():
    (out,) = _recorded_add(torch.randn(2), torch.randn(2))
    with pytest.raises(AttributeError):
        out.vid = 7
    meta = _core.TensorMeta(dtype_code=CODES[torch.float16], device="cpu", shape=[2, 3], requires_grad=False)
    with pytest.raises(AttributeError):
        meta.shape = (1,)


def test_tensor_meta_is_checked_where_it_is_made():
    meta = _core.TensorMeta(dtype_code=CODES[torch.bfloat16], device="cpu", shape=[2, 3], requires_grad=True)
    assert (meta.dtype_code, meta.device, meta.shape, meta.requires_grad) == (
        CODES[torch.bfloat16],
        "cpu",
        (2, 3),
        True,
    )
    assert meta == _core.TensorMeta(dtype_code=CODES[torch.bfloat16], device="cpu", shape=(2, 3), requires_grad=True)
    assert meta != _core.TensorMeta(dtype_code=CODES[torch.bfloat16], device="cpu", shape=(2, 3), requires_grad=False)
    with pytest.raises(TypeError, match="bad dtype code 250"):
        _core.TensorMeta(dtype_code=250, device="cpu", shape=[2], requires_grad=False)
    with pytest.raises(ValueError, match="nowhere"):
        _core.TensorMeta(dtype_code=CODES[torch.float32], device="nowhere", shape=[2], requires_grad=False)
    with pytest.raises(TypeError):
        _core.TensorMeta(CODES[torch.float32], "cpu", [2], False)  # keyword-only: no field by position


def test_a_call_records_the_outputs_it_is_given():
    x = torch.randn(4, 2)
    eager = torch.linalg.qr(x)
    metas = [
        _core.TensorMeta(dtype_code=CODES[t.dtype], device=str(t.device), shape=tuple(t.shape), requires_grad=False)
        for t in eager
    ]
    rec = _core.Recorder()
    with recording(rec):
        a = input_proxy(rec, x)
        outs = rec.call(thunder_rs._core.register_symbol("test.qr", fallback=True), (a,), None, metas)
    assert [(o.shape, DTYPES[o.dtype_code]) for o in outs] == [(tuple(t.shape), t.dtype) for t in eager]
    with pytest.raises(TypeError):
        rec.call(0, (), None, [(CODES[torch.float32], "cpu", (2,), False)])  # a tuple is no TensorMeta


def test_compile_returns_a_record_of_its_traces():
    def fn(x):
        return torch.sin(x) * 2

    x = torch.randn(3, requires_grad=True)
    jfn = thunder_rs.jit(fn)
    torch.testing.assert_close(jfn(x), fn(x))
    forward, backward = thunder_rs.last_traces(jfn), thunder_rs.last_backward_traces(jfn)
    assert forward and backward and all(isinstance(t, _core.Trace) for t in forward + backward)
    with torch.no_grad():
        plain = thunder_rs.jit(fn)
        torch.testing.assert_close(plain(x), fn(x))
    assert thunder_rs.last_backward_traces(plain) == []


def test_prim_table_rows_name_their_fields():
    rows = _core.prim_table()
    assert all(isinstance(r, _core.PrimInfo) for r in rows) and prims.TABLE == tuple(rows)
    (sin,) = [r for r in rows if r.name == "sin"]
    assert sin.family == "Unary" and isinstance(sin.promotion, int)
    assert [r for r in rows if r.name == "sum"][0].promotion is None
    assert repr(sin) == f"PrimInfo(name='sin', family='Unary', promotion={sin.promotion})"
    assert len({*rows}) == len(rows)


class _Keeping(FusionExecutor):
    """Fuses what the torch executor can run elementwise and keeps each region it is handed."""

    fuses_decompositions = True

    def __init__(self):
        super().__init__("keeping")
        self.take_from(torch_ex, ["sin", "mul", "add"])
        self.regions: list = []

    def fuse(self, region):
        self.regions.append(region)
        return region.function


def test_a_region_record_carries_its_decomposition_to_an_executor_that_translates():
    def fn(x):
        return torch.sin(x) * 2 + 1

    ex = _Keeping()
    jfn = thunder_rs.jit(fn, executors=[ex])
    x = torch.randn(5)
    torch.testing.assert_close(jfn(x), fn(x))
    (code,) = thunder_rs.last_traces(jfn)[-1].regions()
    (region,) = ex.regions
    assert (region.name, region.key, region.inputs, region.outputs) == (
        code.name,
        code.key,
        tuple(code.inputs),
        tuple(code.outputs),
    )
    assert [c.name for c in region.calls] == ["prims.sin", "prims.mul", "prims.add"]
    assert region.calls == tuple(code.calls) and region.calls[0].args == (region.inputs[0],)
    assert region.dtypes == {name: torch.float32 for name in (*region.inputs, *(c.outputs[0] for c in region.calls))}
    assert repr(region.calls[0]).startswith("LeafCall(name='prims.sin', args=(")
    with pytest.raises(TypeError):
        hash(code)
