"""Definitions the real nvFuser refused on the H200 (nvfuser_direct 0.2.36), the stand-in
``fake_nvfuser_direct`` refusing them the same way, and the executor no longer making them: the
OpInfo gradients that ran eagerly there run in regions here, through the stand-in, equal to eager.

- A Python bool is an Int to the bindings (pybind11's variant caster), so a Bool tensor's pad value
  ``False`` was an Int: "Tensor arg and pad value must have the same dtype" (select_scatter and
  slice_scatter gradients). The executor defines bools as Bool scalars.
- "All slice operation strides must be of const size 1" (diagonal_scatter gradient): a slice with a
  step is left to torch.
- A gather's result is evaluated by ATen in a segment of its own and handed on densely; where the
  definition made a dim of it an expanded broadcast (an index computed from a broadcast, which
  nvFuser also hands on with stride 0) the next segment refused it: "has expanded extent but input
  tensor has size 2 and stride 1" (index_reduce, index_copy, index_put gradients). The executor
  materializes gathers' operands and its outputs that may be expanded.
- A layer norm of a column-major input: "Vectorized dim for producer has to be from an inner most
  position" (test_cuda.py's region test, on the H100 and the H200). The executor runs such a layout
  on row-major copies.
"""

import warnings

import pytest
import torch

import thunder_rs
import test_ops
from opinfos import OPINFOS

import fake_nvfuser_direct as fake

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # the named executor warns that the real nvfuser_direct is absent
    from thunder_rs.executors import nvfuser_ex

pytestmark = test_ops.WARNING_FILTERS

OPS = {op.id: op for op in OPINFOS}
HALF = dict(rtol=3e-2, atol=3e-2)


# -- what the bindings refuse ----------------------------------------------------------------------


def _bool_pad(module, fd, device):
    x = fd.define_tensor([2, 3], [True, True], module.DataType.Bool)
    fd.add_output(fd.ops.pad(x, [1, 1], False))
    return [torch.ones(2, 3, dtype=torch.bool, device=device)]


def _stepped_slice(module, fd, device):
    x = fd.define_tensor([4, 6], [True, True], module.DataType.Float)
    fd.add_output(fd.ops.slice(x, [0, 0], [4, 6], [1, 2]))
    return [torch.ones(4, 6, device=device)]


def _gather_of_an_expanded_index(module, fd, device):
    # index_copy's gradient region on the H200: its index came from a region that broadcast it.
    x = fd.define_tensor([2, 4], [True, True], module.DataType.Float)
    index = fd.define_tensor([2, 2], [None, True], module.DataType.Int, stride_order=[1, 0])
    fd.add_output(fd.ops.full([2, 2], 0.0, module.DataType.Float))
    fd.add_output(fd.ops.gather(x, index, 1))
    return [torch.randn(2, 4, device=device), torch.tensor([[1, 3]], device=device).expand(2, 2)]


#: (what, define(module, fd, device) -> inputs, the message nvFuser gives)
REFUSED = [
    ("pad value False of a Bool tensor", _bool_pad, "pad value must have the same dtype"),
    ("slice with a step", _stepped_slice, "strides must be of const size 1"),
    ("gather of an expanded index", _gather_of_an_expanded_index, "has expanded extent but input tensor has size"),
]


def _check_refused(module, define, match, device):
    with pytest.raises(Exception, match=match):  # noqa: PT012 (refused while defining or compiling)
        with module.FusionDefinition() as fd:
            inputs = define(module, fd, device)
        fd.execute(inputs)


@pytest.mark.parametrize(("what", "define", "match"), REFUSED, ids=[r[0] for r in REFUSED])
def test_the_stand_in_refuses_what_nvfuser_refused(what, define, match):
    _check_refused(fake, define, match, "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize(("what", "define", "match"), REFUSED, ids=[r[0] for r in REFUSED])
def test_the_real_bindings_refuse_it(what, define, match, real_nvfuser):
    _check_refused(real_nvfuser, define, match, "cuda")


def test_the_stand_in_reads_a_python_bool_as_an_int():
    with fake.FusionDefinition() as fd:
        c = fd.define_tensor([2], [True], fake.DataType.Bool)
        as_python = fd.ops.where(c, True, False)
        true, false = (fd.define_scalar(v, dtype=fake.DataType.Bool) for v in (True, False))
        as_bool = fd.ops.where(c, true, false)
    assert as_python.dtype() == fake.DataType.Int and as_bool.dtype() == fake.DataType.Bool
    with fake.FusionDefinition() as fd:
        x = fd.define_tensor([2, 3], [True, True], fake.DataType.Bool)
        fd.add_output(fd.ops.pad(x, [1, 1], fd.define_scalar(False, dtype=fake.DataType.Bool)))
    assert fd.execute([torch.ones(2, 3, dtype=torch.bool)])[0].tolist() == [[False, True, True, True, False]] * 2


def test_the_stand_in_hands_on_expanded_outputs_with_stride_0():
    with fake.FusionDefinition() as fd:
        x = fd.define_tensor([3], [True], fake.DataType.Float)
        fd.add_output(fd.ops.add(fd.ops.broadcast_in_dim(x, [3, 4], [0]), 1.0))
    (out,) = fd.execute([torch.arange(3.0)])
    assert out.stride() == (1, 0) and out.tolist() == [[1.0] * 4, [2.0] * 4, [3.0] * 4]


def test_the_stand_in_refuses_to_vectorize_a_column_major_normalization():
    with fake.FusionDefinition() as fd:
        x = fd.define_tensor([4, 8], [True, True], fake.DataType.Float, stride_order=[0, 1])
        mean = fd.ops.sum(x, [1], False)
        fd.add_output(fd.ops.sub(x, fd.ops.broadcast_in_dim(mean, [4, 8], [0])))
    with pytest.raises(RuntimeError, match="Vectorized dim for producer has to be from an inner most position"):
        fd.execute([torch.randn(8, 4).t()])


# -- the executor makes none of them --------------------------------------------------------------

#: op id -> the fd.ops name a region of its gradient computes with nvFuser (the op is not left to torch).
#: (diagonal_scatter's gradient is eager's own: a diagonal_scatter of zeros into the cotangent and its
#: diagonal, a view, each one torch kernel as in eager's backward, for eager's layouts.)
GRADIENTS = {
    "select_scatter": "pad",
    "slice_scatter": "pad",
    "index_reduce_prod": "gather",
    "index_reduce_mean": "gather",
    "index_reduce_amax": "gather",
    "index_reduce_amin": "gather",
    "index_copy": "gather",
    "index_put": "index_select",
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=test_ops.dtype_name)
@pytest.mark.parametrize("op_id", sorted(GRADIENTS))
def test_gradients_that_ran_eagerly_on_the_h200_run_in_regions(op_id, dtype, fake_ex):
    op = OPS[op_id]
    sample = test_ops.sample_at(op, dtype, "cpu", 0)
    expected = test_ops.eager_grads_or_skip(op, sample, op.op)
    actual = test_ops.grads(op, sample, thunder_rs.jit(op.op, executors=[fake_ex]))
    test_ops.assert_same(actual, expected, HALF if dtype == torch.bfloat16 else op.tolerance(dtype), sample)
    assert fake_ex.stats["failures"] == 0, fake_ex.fallbacks
    recorded = [name for d in fake.definitions if d.executions for name in d.recorded]
    assert GRADIENTS[op_id] in recorded, recorded
    assert fake_ex.stats["dense_copies"] == 0


def test_a_gather_of_a_broadcast_index_is_fused(fake_ex):
    # The index is broadcast in the region itself, and the values gathered too: both materialized.
    def f(x, i):
        index = i.reshape(3, 1).expand(3, 4)
        return torch.gather(x * 2, 1, index) + 1, torch.take_along_dim(
            x.sum(1, keepdim=True).expand(3, 4) * 1, index, 1
        )

    x, i = torch.randn(3, 5), torch.tensor([4, 0, 2])
    actual, expected = thunder_rs.jit(f, executors=[fake_ex])(x, i), f(x, i)
    torch.testing.assert_close(actual, expected)
    assert fake_ex.stats["failures"] == 0, fake_ex.fallbacks
    assert {"gather", "take_along_axis"} <= {name for d in fake.definitions for name in d.recorded}


def test_outputs_have_eagers_strides_where_nvfuser_would_expand_them(fake_ex):
    def f(x):
        y = x.reshape(3, 1).expand(3, 4) + 1
        return y * 2, (x + 1).exp()

    x = torch.randn(3)
    actual, expected = thunder_rs.jit(f, executors=[fake_ex])(x), f(x)
    torch.testing.assert_close(actual, expected)
    assert [t.stride() for t in actual] == [t.stride() for t in expected]
    actual[0].add_(1)  # writable, as eager's
    assert fake_ex.stats["failures"] == 0 and fake.definitions


def test_a_layout_nvfuser_cannot_schedule_runs_on_row_major_copies(fake_ex):
    def f(x, w):
        return torch.nn.functional.layer_norm(x, (x.shape[-1],), w) * 2

    x, w = torch.randn(8, 16), torch.randn(16)
    jfn = thunder_rs.jit(f, executors=[fake_ex])
    for args in ((x, w), (x.t().contiguous().t(), w), (x.t().contiguous().t(), w)):
        torch.testing.assert_close(jfn(*args), f(*args))
    assert fake_ex.stats["failures"] == 0 and fake_ex.stats["dense_copies"] == 1
    assert fake_ex.stats["definitions"] == 2  # the row-major layout's, and the copies' (another one)


def test_a_layout_that_fails_copied_too_runs_eagerly_with_both_errors(fake_ex, monkeypatch):
    def refuse(arg, *args, **kwargs):
        raise RuntimeError("no reduction today")

    monkeypatch.setattr(fake.ops, "welford", refuse)  # (the layer norm's var_mean: nvfuser_numbers)
    x, w = torch.randn(8, 16).t().contiguous().t(), torch.randn(16)
    jfn = thunder_rs.jit(lambda x, w: torch.nn.functional.layer_norm(x, (16,), w) * 2, executors=[fake_ex])
    with pytest.warns(UserWarning, match="runs eagerly.*no reduction today.*copied row-major.*no reduction today"):
        torch.testing.assert_close(jfn(x, w), torch.nn.functional.layer_norm(x, (16,), w) * 2)
    assert fake_ex.stats["failures"] == 1 and fake_ex.stats["dense_copies"] == 0


def test_checkers_leave_stepped_slices_to_torch():
    slice_ = nvfuser_ex.make_checker("slice", True)
    x = torch.ones(4, 6)
    assert slice_(x, (0, 0), (4, 6), (1, 1)) and not slice_(x, (0, 0), (4, 6), (1, 2))
