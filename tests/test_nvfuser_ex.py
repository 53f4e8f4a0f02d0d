"""The nvFuser executor on the CPU, backed by a stand-in ``nvfuser_direct`` (``fake_nvfuser_direct``)
that follows the real bindings' names and evaluates definitions with torch: every translated
prim against the torch executor, the per-layout definition cache, gradients through regions,
and what happens when nvFuser does not import. The CUDA tests with the real nvFuser are in
``test_cuda.py``."""

import contextlib
import copy
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import thunder_rs
from thunder_rs import prims
from thunder_rs.executors import nvfuser_default
from thunder_rs.errors import ThunderNotImplementedError

import fake_nvfuser_direct as fake

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from gpt import GPT, Block, GPTConfig, random_tokens  # noqa: E402

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # the named executor warns that the real nvfuser_direct is absent
    from thunder_rs.executors import nvfuser_ex
    from thunder_rs.executors.nvfuser_ex import TRANSLATIONS, NvFuserExecutor, NvFuserRegion


def _regions(jfn):
    return [region.name for region in thunder_rs.last_traces(jfn)[-1].regions()]


# -- every translation against the torch executor --------------------------------------------------

X = torch.linspace(0.1, 0.9, 32).reshape(4, 8)
Y = torch.linspace(0.2, 1.4, 32).reshape(4, 8).flip(0)
IX = torch.arange(32).reshape(4, 8) % 7 + 1
IY = torch.arange(32).reshape(4, 8).flip(1) % 5 + 1
BITWISE = {"bitwise_and", "bitwise_or", "bitwise_xor"}
CPU = torch.device("cpu")
#: prim -> (function of the inputs and the floating dtype calling it, inputs); floating inputs
#: are converted to the dtype under test.
SAMPLES = {
    "where": (lambda x, y, dt: prims.where(prims.gt(x, 0.5), x, y), (X, Y)),
    "convert_element_type": (lambda x, dt: prims.convert_element_type(x, torch.float16), (X,)),
    "broadcast_in_dim": (lambda v, dt: prims.broadcast_in_dim(v, (4, 8), (1,)), (X[0].clone(),)),
    "reshape": (lambda x, dt: prims.reshape(x, (8, 4)), (X,)),
    "transpose": (lambda x, dt: prims.transpose(x, (1, 0)), (X,)),
    "slice": (lambda x, dt: prims.slice(x, (0, 1), (4, 7), (1, 1)), (X,)),  # steps of 1: nvFuser has no others
    "squeeze": (lambda x, dt: prims.squeeze(x, (0,)), (X[:1].clone(),)),
    "cat": (lambda x, y, dt: prims.cat([x, y], 0), (X, Y)),
    "pad": (lambda x, dt: prims.pad(x, 0.5, ((1, 2, 0), (0, 1, 0))), (X,)),
    "full": (lambda x, dt: prims.add(x, prims.full((4, 8), 1.5, CPU, dt)), (X,)),
    "iota": (lambda x, dt: prims.add(x, prims.iota(8, 2, 3, CPU, dt)), (X[0].clone() * 100,)),
    "sum": (lambda x, dt: prims.sum(x, (1,)), (X,)),
    "prod": (lambda x, dt: prims.prod(x, (0,)), (Y,)),
    "amax": (lambda x, dt: prims.amax(x, (1,)), (Y,)),
    "amin": (lambda x, dt: prims.amin(x, (0, 1)), (Y,)),
    "var": (lambda x, dt: prims.var(x, (1,), 1), (Y,)),
    "var_mean": (lambda x, dt: prims.var_mean(x, (0,), 0), (Y,)),
    "cumsum": (lambda x, dt: prims.cumsum(x, 1), (Y,)),
    "cumprod": (lambda x, dt: prims.cumprod(x, 0), (Y,)),
    "take": (lambda x, i, dt: prims.take(x, i, 1), (Y, torch.tensor([3, 0, 7, 3]))),
    "take_along_axis": (lambda x, i, dt: prims.take_along_axis(x, i, 1), (Y, IY % 8)),
    "gather": (lambda x, i, dt: prims.gather(x, i, 1), (Y, IY[:, :3] % 8)),
}
ALT = {"acosh": X + 1, "bitwise_not": IX}
#: (prim, dtype) the executor leaves to torch: nvFuser has no such op.
REFUSED = {("nextafter", torch.bfloat16), ("nextafter", torch.float16)}
#: The ``fd.ops`` name each prim becomes, where it is not the prim's own.
OP_NAMES = {
    "convert_element_type": "cast",
    "transpose": "permute",
    "amax": "max",
    "amin": "min",
    "take": "index_select",
    "var": "welford",  # (its M2 divided by the count, as torch's WelfordOps: nvfuser_numbers.translate_var_mean)
    "var_mean": "welford",
}
#: Reduced-precision floats as eager computes them: each op in float32, rounded at its output.
HALF_DTYPES = (torch.bfloat16, torch.float16)
FLOAT_DTYPES = (torch.float32, *HALF_DTYPES)


def DTYPE_ID(dtype):
    return str(dtype).removeprefix("torch.")


def _sample(name, dtype):
    if name in SAMPLES:
        fn, inputs = SAMPLES[name]
    else:
        prim = getattr(prims, name)
        fn = lambda *args: prim(*args[:-1])  # noqa: E731 (the dtype is the last argument)
        if name in nvfuser_ex.UNARY:
            inputs = (ALT.get(name, X),)
        else:
            inputs = (IX, IY) if name in BITWISE else (X, Y)
    return fn, tuple(t.to(dtype) if t.is_floating_point() else t for t in inputs)


def _eager_and_fused(program, inputs, executor):
    expected = thunder_rs.jit(program, executors=[])(*inputs)
    jfn = thunder_rs.jit(program, executors=[executor])
    return jfn(*inputs), expected, jfn


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_ID)
@pytest.mark.parametrize("name", sorted(TRANSLATIONS))
def test_translation_matches_the_torch_executor(name, dtype, fake_ex):
    fn, inputs = _sample(name, dtype)

    def program(*args):
        # Two more calls, so that the prim is in a region worth making even when it is a shape op.
        return fn(*args, dtype), prims.neg(args[0]), prims.abs(args[0])

    try:
        thunder_rs.jit(program, executors=[])(*inputs)
    except Exception as e:  # noqa: BLE001 (the prim refuses the dtype, as torch does: nothing to fuse)
        pytest.skip(f"prims.{name} on {dtype}: {type(e).__name__}: {e}")
    actual, expected, jfn = _eager_and_fused(program, inputs, fake_ex)
    # Each value a region hands on has eager's dtype (assert_close compares them) and its value.
    torch.testing.assert_close(actual, expected, equal_nan=True)
    assert _regions(jfn) == ["nvfuser_fake_fusion0"], thunder_rs.last_traces(jfn)[-1]
    assert fake_ex.stats["failures"] == 0
    recorded = [op for d in fake.definitions for op in d.recorded]
    # The views pass may turn a squeeze into the reshape it is.
    expected_ops = {"squeeze", "reshape"} if name == "squeeze" else {OP_NAMES.get(name, name)}
    assert bool(expected_ops & set(recorded)) is ((name, dtype) not in REFUSED) and "neg" in recorded, recorded


# -- the stand-in follows nvFuser's type rules ------------------------------------------------------

#: (what the definition does, the DataType names of its tensor inputs, the result's DataType
#: name): nvFuser's rules, each from the source file and function named. ``op(ops, dt, *inputs)``
#: takes the module's ``DataType`` as ``dt``.
TYPE_RULES = [
    # type_promotion.cpp computeTypes: halves compute in Float; scalars promote by category.
    ("add", lambda o, dt, a, b: o.add(a, b), ("BFloat16", "BFloat16"), "Float"),
    ("mul half scalar", lambda o, dt, a: o.mul(a, 2.0), ("Half",), "Float"),
    ("add bf16 float", lambda o, dt, a, b: o.add(a, b), ("BFloat16", "Float"), "Float"),
    ("add int32 int", lambda o, dt, a: o.add(a, 1), ("Int32",), "Int32"),
    ("add int32 int64", lambda o, dt, a, b: o.add(a, b), ("Int32", "Int"), "Int"),
    ("add int double", lambda o, dt, a: o.add(a, 2.5), ("Int",), "Double"),
    ("add float float scalar", lambda o, dt, a: o.add(a, o.cast(2.5, dt.Float)), ("Float",), "Float"),
    ("add bool bool", lambda o, dt, a, b: o.add(a, b), ("Bool", "Bool"), "Bool"),
    ("sub bool int", lambda o, dt, a: o.sub(a, 1), ("Bool",), "Int"),
    ("div int", lambda o, dt, a, b: o.div(a, b), ("Int", "Int"), "Int"),
    ("pow float double", lambda o, dt, a: o.pow(a, 2.0), ("Float",), "Float"),
    ("maximum half", lambda o, dt, a, b: o.maximum(a, b), ("Half", "Half"), "Float"),
    # arith.cpp: float_op_config (exp, sin, truediv, atan2): integers and halves to Float.
    ("exp int", lambda o, dt, a: o.exp(a), ("Int",), "Float"),
    ("exp double", lambda o, dt, a: o.exp(a), ("Double",), "Double"),
    ("sin bf16", lambda o, dt, a: o.sin(a), ("BFloat16",), "Float"),
    ("truediv int", lambda o, dt, a, b: o.truediv(a, b), ("Int32", "Int32"), "Float"),
    ("atan2 int", lambda o, dt, a, b: o.atan2(a, b), ("Int", "Int"), "Float"),
    ("reciprocal bool", lambda o, dt, a: o.reciprocal(a), ("Bool",), "Float"),
    # arith.cpp: neg promotes halves (default_op_config); abs, ceil, round... keep the dtype.
    ("neg bf16", lambda o, dt, a: o.neg(a), ("BFloat16",), "Float"),
    ("neg int32", lambda o, dt, a: o.neg(a), ("Int32",), "Int32"),
    ("abs bf16", lambda o, dt, a: o.abs(a), ("BFloat16",), "BFloat16"),
    ("sign bf16", lambda o, dt, a: o.sign(a), ("BFloat16",), "BFloat16"),
    # arith.cpp getOutputType: comparisons and logical ops give Bool; the is-ops and signbit too.
    ("eq bf16", lambda o, dt, a, b: o.eq(a, b), ("BFloat16", "BFloat16"), "Bool"),
    ("lt int float", lambda o, dt, a: o.lt(a, 0.5), ("Int",), "Bool"),
    ("signbit bf16", lambda o, dt, a: o.signbit(a), ("BFloat16",), "Bool"),
    ("bitwise_and bools", lambda o, dt, a, b: o.bitwise_and(a, b), ("Bool", "Bool"), "Bool"),
    ("bitwise_not int32", lambda o, dt, a: o.bitwise_not(a), ("Int32",), "Int32"),
    # arith.cpp where: the common dtype without halves to Float; two Python floats are Double.
    ("where bf16 scalar", lambda o, dt, c, a: o.where(c, a, 1.0), ("Bool", "BFloat16"), "BFloat16"),
    ("where scalars", lambda o, dt, c: o.where(c, 1.0, 0.0), ("Bool",), "Double"),
    # ops.cpp convertToVal: a Python bool is an Int (pybind11 tries the variant's int64_t first).
    ("where python bools", lambda o, dt, c: o.where(c, True, False), ("Bool",), "Int"),
    ("where int double", lambda o, dt, c, a: o.where(c, a, 2.5), ("Bool", "Int"), "Double"),
    ("where bf16 float", lambda o, dt, c, a, b: o.where(c, a, b), ("Bool", "BFloat16", "Float"), "Float"),
    # arith.cpp sum/prod: integers and bools sum in Int; a dtype casts first; max keeps the dtype.
    ("sum int32", lambda o, dt, a: o.sum(a, [0], False), ("Int32",), "Int"),
    ("sum bool", lambda o, dt, a: o.sum(a, [0], False), ("Bool",), "Int"),
    ("sum bf16 to float", lambda o, dt, a: o.sum(a, [0], False, dt.Float), ("BFloat16",), "Float"),
    ("prod float", lambda o, dt, a: o.prod(a, [1], False), ("Float",), "Float"),
    ("max int32", lambda o, dt, a: o.max(a, [0], False), ("Int32",), "Int32"),
    # normalization.cpp variance: mean over a Double count; scan keeps halves (arith.cpp scan).
    ("var float", lambda o, dt, a: o.var(a, [0], 1, False), ("Float",), "Float"),
    ("var int", lambda o, dt, a: o.var(a, [0], 1, False), ("Int",), "Double"),
    ("cumsum bf16", lambda o, dt, a: o.cumsum(a, 0), ("BFloat16",), "BFloat16"),
    # arith.cpp iota/full, and castOp: the given dtype.
    ("iota", lambda o, dt: o.iota(4, 0, 1, dt.Int), (), "Int"),
    ("iota float", lambda o, dt: o.iota(4, 0.0, 1.0, dt.BFloat16), (), "BFloat16"),
    ("full", lambda o, dt: o.full([2, 2], 0, dt.BFloat16), (), "BFloat16"),
    ("cast", lambda o, dt, a: o.cast(a, dt.Half), ("Float",), "Half"),
    ("pad", lambda o, dt, a: o.pad(a, [1, 1], 0.0), ("BFloat16",), "BFloat16"),
]
#: Definitions nvFuser takes, with these dtypes, but cannot compile: its Half and BFloat16 have no
#: such functions in generated code (seen on the H100: NVRTC found no ``ceil``, no ``!=`` of
#: ``nvf::__half``; a ReductionOp of BFloat16 failed too).
UNCOMPILABLE = [
    ("ceil half", lambda o, dt, a: o.ceil(a), ("Half",), "Half"),
    ("isnan half", lambda o, dt, a: o.isnan(a), ("Half",), "Bool"),
    ("sum bf16", lambda o, dt, a: o.sum(a, [0], False), ("BFloat16",), "BFloat16"),
]
#: What nvFuser refuses, with the message its check gives.
TYPE_ERRORS = [
    ("nextafter half", lambda o, dt, a, b: o.nextafter(a, b), ("BFloat16", "BFloat16"), "single or double precision"),
    ("var_mean half", lambda o, dt, a: o.var_mean(a, [0], 1, False), ("Half",), "upcast to float"),
    ("cat mixed", lambda o, dt, a, b: o.cat([a, b], 0), ("BFloat16", "Float"), "different data types"),
    ("pad int value", lambda o, dt, a: o.pad(a, [1, 1], 0), ("Float",), "pad value must have the same dtype"),
    ("iota int start", lambda o, dt: o.iota(4, 0, 1, dt.Float), (), "start dtype does not match"),
    ("where int condition", lambda o, dt, c, a: o.where(c, a, a), ("Int", "Float"), "should be of DataType Bool"),
    ("bitwise float", lambda o, dt, a, b: o.bitwise_or(a, b), ("Float", "Float"), "Integer or boolean input"),
    ("max dtype", lambda o, dt, a: o.max(a, [0], False, dt.Float), ("Float",), "dtype other than Null"),
]


@contextlib.contextmanager
def _defined(module, dtype_names):
    """A definition of ``module`` with a [2, 3] tensor input of each dtype."""
    with module.FusionDefinition() as fd:
        yield fd, [fd.define_tensor([2, 3], [True, True], getattr(module.DataType, d)) for d in dtype_names]


def _check_type_rule(module, op, dtype_names, result, device, compiles=True):
    with _defined(module, dtype_names) as (fd, inputs):
        out = op(fd.ops, module.DataType, *inputs)
        fd.add_output(out)
    assert out.dtype() == getattr(module.DataType, result)
    args = [torch.ones(2, 3, dtype=TORCH_DTYPES[d], device=device) for d in dtype_names]
    if compiles:  # the values are computed in that dtype too
        assert fd.execute(args)[0].dtype == TORCH_DTYPES[result]
    else:
        with pytest.raises(RuntimeError):
            fd.execute(args)


def _check_type_error(module, op, dtype_names, match):
    with pytest.raises(Exception, match=match), _defined(module, dtype_names) as (fd, inputs):
        op(fd.ops, module.DataType, *inputs)


TORCH_DTYPES = {name: dtype for dtype, name in nvfuser_ex.DTYPES.items()}


@pytest.mark.parametrize(("what", "op", "dtypes", "result"), TYPE_RULES, ids=[r[0] for r in TYPE_RULES])
def test_the_stand_in_follows_nvfusers_type_rules(what, op, dtypes, result):
    _check_type_rule(fake, op, dtypes, result, "cpu")


@pytest.mark.parametrize(("what", "op", "dtypes", "match"), TYPE_ERRORS, ids=[r[0] for r in TYPE_ERRORS])
def test_the_stand_in_refuses_what_nvfuser_refuses(what, op, dtypes, match):
    _check_type_error(fake, op, dtypes, match)


@pytest.mark.gpu
@pytest.mark.parametrize(("what", "op", "dtypes", "result"), TYPE_RULES, ids=[r[0] for r in TYPE_RULES])
def test_the_real_bindings_follow_the_same_type_rules(what, op, dtypes, result, real_nvfuser):
    _check_type_rule(real_nvfuser, op, dtypes, result, "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize(("what", "op", "dtypes", "match"), TYPE_ERRORS, ids=[r[0] for r in TYPE_ERRORS])
def test_the_real_bindings_refuse_the_same(what, op, dtypes, match, real_nvfuser):
    _check_type_error(real_nvfuser, op, dtypes, match)


@pytest.mark.parametrize(("what", "op", "dtypes", "result"), UNCOMPILABLE, ids=[r[0] for r in UNCOMPILABLE])
def test_the_stand_in_compiles_no_half_function_nvfuser_lacks(what, op, dtypes, result):
    _check_type_rule(fake, op, dtypes, result, "cpu", compiles=False)


@pytest.mark.gpu
@pytest.mark.parametrize(("what", "op", "dtypes", "result"), UNCOMPILABLE, ids=[r[0] for r in UNCOMPILABLE])
def test_the_real_bindings_compile_no_such_half_function(what, op, dtypes, result, real_nvfuser):
    _check_type_rule(real_nvfuser, op, dtypes, result, "cuda", compiles=False)


# -- regions hand on eager's dtypes and compute as torch does ----------------------------------------


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_ID)
def test_regions_match_eager_in_each_dtype_and_layout(dtype, fake_ex):
    # test_cuda.py's region test (which failed on the H100 in each dtype) on the stand-in.
    def f(x, y, w):
        h = torch.nn.functional.layer_norm(x + y, (x.shape[-1],), w)
        return torch.nn.functional.gelu(h, approximate="tanh").softmax(-1), (h * h).sum(0)

    torch.manual_seed(0)
    x, y = (torch.randn(16, 32, dtype=dtype) for _ in range(2))
    w = torch.randn(32, dtype=dtype)
    jfn = thunder_rs.jit(f, executors=[fake_ex])
    for args in ((x, y, w), (x.t().contiguous().t(), y, w)):  # two layouts: two definitions
        torch.testing.assert_close(jfn(*args), f(*args))
    assert _regions(jfn) and fake_ex.stats["failures"] == 0 and fake_ex.stats["definitions"] == 2
    # nvFuser cannot schedule the column-major layout's layer norm: it runs on row-major copies.
    assert fake_ex.stats["dense_copies"] == 1
    # the first call's split that benchmarks/gpu_bench.py reports: Python definition, nvFuser compile
    assert fake_ex.stats["define_s"] > 0 and fake_ex.stats["compile_s"] > 0


@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=DTYPE_ID)
def test_a_chain_of_ops_rounds_as_eager_does(dtype, fake_ex):
    # Eager rounds each op's result to the dtype; a region hands on the same bits. Inside one
    # op's decomposition (layer_norm, softmax) the trace itself computes in float32, as torch's kernels.
    def f(x, y):
        z = (x * 3 + y).sin() * y - x / 3
        return z, z.exp().cumsum(1), torch.arange(300, dtype=x.dtype) + 1, torch.zeros(4, 8, dtype=x.dtype) + x

    x, y = torch.randn(4, 8, dtype=dtype), torch.randn(4, 8, dtype=dtype)
    actual, expected, jfn = _eager_and_fused(f, (x, y), fake_ex)
    torch.testing.assert_close(actual, f(x, y), rtol=0, atol=0)
    assert _regions(jfn) and fake_ex.stats["failures"] == 0


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_ID)
def test_numbers_are_read_as_torch_reads_them(dtype, fake_ex):
    # A comparison reads 0.8 as the tensor's dtype reads it (bfloat16 0.80078125 > 0.8 is false
    # there); a product reads 0.1 as a float32, not as nvFuser's double.
    def f(x):
        return (x > 0.8) | (x <= 0.2), x == 0.8, torch.clamp(x, 0.2, 0.8) * 0.1, torch.fmod(x, 0.3) * 0.7

    x = torch.tensor([0.1, 0.2, 0.3, 0.6, 0.8, 0.9], dtype=dtype)
    actual, expected, jfn = _eager_and_fused(f, (x,), fake_ex)
    torch.testing.assert_close(actual, f(x), rtol=0, atol=0)
    assert _regions(jfn) and fake_ex.stats["failures"] == 0


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.float16], ids=DTYPE_ID)
def test_a_trapezoid_over_an_empty_dim_keeps_the_dtype_of_y(dtype, fake_ex):
    # Eager returns zeros of y's dtype there (zeros_like_except), integer and bool too; the
    # decomposition the region runs gave float32 zeros.
    def f(y):
        return torch.trapezoid(y), torch.trapezoid(y, dx=2), y.sum(1) * 2

    for rows in (3, 5):  # the symbolic entry serves the second
        y = torch.zeros(rows, 0, dtype=dtype)
        actual = thunder_rs.jit(f, executors=[fake_ex, "torch"], dynamic=True)(y)
        for a, e in zip(actual, f(y)):
            assert a.dtype == e.dtype and a.shape == e.shape
            torch.testing.assert_close(a, e)


def test_definitions_hand_on_eager_dtypes_without_per_call_conversions(fake_ex):
    def f(x, i):
        return (x * 2).exp(), (i + 1).sum(0), torch.where(x > 0, 1.0, 0.0), torch.arange(5) * 2

    x, i = torch.randn(4, 8, dtype=torch.bfloat16), torch.ones(4, 8, dtype=torch.int32)
    ex = Capturing("nvfuser_capturing", module=fake, allow_cpu=True)
    ex.fused = []
    actual = thunder_rs.jit(f, executors=[ex])(x, i)
    assert [t.dtype for t in actual] == [t.dtype for t in f(x, i)]
    (region,) = ex.fused
    # The definition's own outputs have the dtypes: the per-call path converts nothing.
    run = next(iter(region.definitions.values()))
    outputs = run.fd.execute([x, i])
    assert [t.dtype for t in outputs] == [region.region.dtypes[name] for name in region.region.outputs]


@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=DTYPE_ID)
def test_gpt_training_steps_under_autocast_match_eager(dtype, fake_ex):
    # The default CUDA path failed its first backward under bfloat16 autocast on the H100
    # ("expected mat1 and mat2 to have the same dtype"): regions handed on float32.
    config = GPTConfig()
    model = GPT(config, seed=0)
    eager = copy.deepcopy(model)
    jmodel = thunder_rs.jit(model, executors=[fake_ex])
    for step in range(2):
        idx = random_tokens(config, 2, config.block_size, seed=step)
        targets = random_tokens(config, 2, config.block_size, seed=100 + step)
        with torch.autocast("cpu", dtype=dtype):
            loss, loss_e = jmodel(idx, targets)[1], eager(idx, targets)[1]
        torch.testing.assert_close(loss, loss_e, rtol=3e-2, atol=3e-2)
        loss.backward()
        loss_e.backward()
        for (name, p), pe in zip(model.named_parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad, pe.grad, rtol=5e-2, atol=5e-2, msg=lambda m: f"grad of {name}: {m}")
        model.zero_grad(), eager.zero_grad()
    assert fake_ex.stats["definitions"] >= 2 and fake_ex.stats["failures"] == 0


# -- refusals ---------------------------------------------------------------------------------------


def test_cpu_tensors_are_not_claimed_without_the_test_switch():
    ex = NvFuserExecutor("nvfuser_cpu_refused", module=fake)
    jfn = thunder_rs.jit(lambda x: (x.sin() + 1).exp(), executors=[ex])
    x = torch.randn(4)
    torch.testing.assert_close(jfn(x), (x.sin() + 1).exp())
    assert _regions(jfn) == []


def test_unsupported_arguments_are_left_to_torch(fake_ex):
    def f(x, y):
        return (x + 1).flip(0) * 2, (y + 1) * 2  # flip has no translation; int8 no nvFuser dtype

    x, y = torch.randn(4), torch.arange(4, dtype=torch.int8)
    jfn = thunder_rs.jit(f, executors=[fake_ex])
    torch.testing.assert_close(jfn(x, y), f(x, y))
    trace = thunder_rs.last_traces(jfn)[-1]
    calls = [call for region in trace.regions() for call in region.calls]
    assert "prims.flip" not in [call.name for call in calls]
    assert all("int8" not in str(a) for call in calls for a in call.args)


def test_a_region_nvfuser_cannot_define_runs_eagerly_with_a_warning(fake_ex, monkeypatch):
    def broken(arg):
        raise RuntimeError("no kernel")

    monkeypatch.setattr(fake.ops, "sin", broken)
    jfn = thunder_rs.jit(lambda x: (x.sin() + 1).exp(), executors=[fake_ex])
    x = torch.randn(4)
    with pytest.warns(UserWarning, match="runs eagerly.*no kernel"):
        torch.testing.assert_close(jfn(x), (x.sin() + 1).exp())
    torch.testing.assert_close(jfn(x * 2), (x * 2).sin().add(1).exp())
    assert fake_ex.stats["failures"] == 1
    assert len(fake_ex.fallbacks) == 1 and "runs eagerly" in fake_ex.fallbacks[0]


def test_without_nvfuser_everything_runs_on_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "nvfuser_direct", None)  # import raises ImportError
    ex = NvFuserExecutor("nvfuser_missing")
    assert not ex.available and "nvfuser_direct" in ex.unavailable and not ex.registry
    jfn = thunder_rs.jit(lambda x: (x.sin() + 1).exp(), executors=[ex])
    x = torch.randn(4)
    torch.testing.assert_close(jfn(x), (x.sin() + 1).exp())
    assert _regions(jfn) == []


def test_defaults_are_unchanged_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    before = thunder_rs.executors.get_default_executors()
    assert not nvfuser_default.use_nvfuser_on_cuda()
    assert thunder_rs.executors.get_default_executors() == before
    assert all(e.name != "nvfuser" for e in before)


def test_nvfuser_becomes_a_default_on_cuda_when_it_imports(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(nvfuser_default.importlib.util, "find_spec", lambda name: object())
    ready = NvFuserExecutor("nvfuser", module=fake)
    monkeypatch.setattr(nvfuser_ex, "nvfuser_executor", lambda: ready)
    try:
        assert nvfuser_default.use_nvfuser_on_cuda()
        defaults = thunder_rs.executors.get_default_executors()
        assert defaults[0] is ready and defaults[-1].name == "torch"
    finally:
        thunder_rs.executors.deregister_executor(ready)
    monkeypatch.setenv("THUNDER_RS_NVFUSER", "0")
    assert not nvfuser_default.use_nvfuser_on_cuda()


def test_unknown_prims_in_a_region_are_an_error_of_the_definition():
    flip = SimpleNamespace(name="prims.flip", args=("t0", (0,)), outputs=["t1"])  # as a _core.LeafCall reads
    region = nvfuser_ex.Region("r", "k", "", lambda x: (x,), ("prims.flip",), 1, 1, ("t0",), (flip,), ("t1",))
    with pytest.raises(ThunderNotImplementedError, match="no translation for prims.flip"):
        nvfuser_ex.define(fake, region, [torch.randn(3)])


def _mask(device):
    """Factories alone: the region computing it has no tensor input."""
    a = torch.arange(8, device=device, dtype=torch.float32)
    return (a[:, None] >= a[None, :]).float() * 2


def _check_factory_region(ex, device):
    ex.fused = []
    out, expected = thunder_rs.jit(_mask, executors=[ex])(device), _mask(device)
    assert out.device == expected.device and torch.equal(out, expected)
    (region,) = ex.fused
    assert region.region.num_inputs == 0 and len(region.definitions) == 1
    assert ex.stats["failures"] == 0, ex.fallbacks
    return region


def test_a_definition_without_tensor_inputs_is_told_its_factories_device(monkeypatch):
    """nvFuser runs a definition with no tensor input on device 0 (``getCommonDeviceCUDA``): a
    mask made on cuda:1, or on "cuda" in a process whose current device is 1 (one process per
    GPU), would be made on device 0. ``fd.execute`` is told the device index."""
    monkeypatch.setitem(sys.modules, "nvfuser_direct", fake)
    region = _check_factory_region(Capturing("nvfuser_factories", module=fake, allow_cpu=True), "cpu")
    assert nvfuser_ex.factory_device(region.region, []) == torch.device("cpu")
    assert nvfuser_ex.factory_device(region.region, [torch.zeros(1)]) is None
    told = []
    execute = lambda inputs, device=None: told.append(device)  # noqa: E731
    nvfuser_ex._told_device(execute, torch.device("cuda:1"))([])
    nvfuser_ex._told_device(execute, torch.device("cpu"))([])
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    nvfuser_ex._told_device(execute, torch.device("cuda"))([])
    assert told == [1, None, 3]


@pytest.mark.gpu
def test_on_cuda_a_definition_without_tensor_inputs_makes_its_tensors_on_eagers_device(real_nvfuser):
    ex = Capturing("nvfuser_factories_cuda", module=real_nvfuser)
    for device in ["cuda", *[f"cuda:{i}" for i in range(torch.cuda.device_count())]]:
        _check_factory_region(ex, device)


# -- the definition cache ---------------------------------------------------------------------------


class Capturing(NvFuserExecutor):
    """Keeps the regions it fuses."""

    def fuse(self, region):
        fused = super().fuse(region)
        self.fused.append(fused)
        return fused


def test_one_definition_per_input_layout(monkeypatch):
    monkeypatch.setitem(sys.modules, "nvfuser_direct", fake)
    ex = Capturing("nvfuser_capturing", module=fake, allow_cpu=True)
    ex.fused = []
    fake.definitions.clear()

    def f(x, y):
        return (x * y + 1).exp().sum(0)

    x, y = torch.randn(8, 6), torch.randn(8, 6)
    thunder_rs.jit(f, executors=[ex])(x, y)
    (region,) = ex.fused
    assert isinstance(region, NvFuserRegion) and len(fake.definitions) == 1
    ref = region.region.function
    layouts = [
        (x, y),
        (x.t().contiguous().t(), y),  # column-major: another stride order
        (torch.randn(8, 12)[:, ::2], y),  # non-contiguous
    ]
    for args in layouts + layouts:
        torch.testing.assert_close(region(*args), ref(*args))
    assert len(region.definitions) == 3 and len(fake.definitions) == 3
    assert [d.executions for d in fake.definitions] == [3, 2, 2]
    # The per-call path: the last layout is reused without a lookup.
    region(*layouts[-1])
    assert fake.definitions[-1].executions == 3


def test_a_lazily_negated_input_is_resolved(fake_ex):
    jfn = thunder_rs.jit(lambda x, y: (x + y).exp(), executors=[fake_ex])
    z = torch.randn(4, dtype=torch.float32)
    torch.testing.assert_close(jfn(z, z), (z + z).exp())


# -- gradients through regions -----------------------------------------------------------------------


def test_gpt_block_forward_and_gradients_match_eager(fake_ex):
    config = GPTConfig()
    torch.manual_seed(0)
    block = Block(config)
    eager = copy.deepcopy(block)
    x = torch.randn(2, 16, config.n_embd, requires_grad=True)
    xe = x.detach().clone().requires_grad_()
    jblock = thunder_rs.jit(block, executors=[fake_ex])
    out, ref = jblock(x), eager(xe)
    torch.testing.assert_close(out, ref)
    g = torch.randn_like(ref)
    out.backward(g)
    ref.backward(g)
    torch.testing.assert_close(x.grad, xe.grad)
    for (name, p), pe in zip(block.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, pe.grad, msg=lambda m: f"grad of {name}: {m}")
    assert _regions(jblock) and thunder_rs.last_backward_traces(jblock)[-1].regions()
    assert fake_ex.stats["failures"] == 0


def test_gpt_training_step_matches_eager(fake_ex):
    config = GPTConfig()
    model = GPT(config, seed=0)
    eager = copy.deepcopy(model)
    jmodel = thunder_rs.jit(model, executors=[fake_ex])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    opt_e = torch.optim.AdamW(eager.parameters(), lr=1e-3)
    for step in range(3):
        idx = random_tokens(config, 2, config.block_size, seed=step)
        targets = random_tokens(config, 2, config.block_size, seed=100 + step)
        loss, loss_e = jmodel(idx, targets)[1], eager(idx, targets)[1]
        torch.testing.assert_close(loss, loss_e)
        loss.backward()
        loss_e.backward()
        opt.step(), opt_e.step(), opt.zero_grad(), opt_e.zero_grad()
    # Decomposed layer norms and softmaxes round differently from eager's kernels; AdamW's
    # normalised update turns that into differences up to lr * 2 in parameters of tiny gradient.
    for (name, p), pe in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p, pe, rtol=1e-4, atol=1e-4, msg=lambda m: f"{name}: {m}")
    assert fake_ex.stats["definitions"] >= 2 and fake_ex.stats["failures"] == 0


def test_checkers():
    add, full = nvfuser_ex.make_checker("add", False), nvfuser_ex.make_checker("full", False)
    x = torch.ones(2)
    assert not add(x, x)  # CPU tensors
    assert nvfuser_ex.make_checker("add", True)(x, x)  # the test switch
    assert not nvfuser_ex.make_checker("add", True)(2, 3)  # numbers alone
    assert not nvfuser_ex.make_checker("add", True)(x.to(torch.int8), 1)  # no nvFuser dtype
    assert not full((2,), 1.0, torch.device("cpu"), torch.float32)
    pad = nvfuser_ex.make_checker("pad", True)
    assert pad(x, 0.0, ((1, 1, 0),)) and not pad(x, 0.0, ((1, 1, 1),)) and not pad(x, 0.0, ((-1, 0, 0),))
    var = nvfuser_ex.make_checker("var", True)
    assert var(x, (0,), 1) and not var(x, (), 1) and not var(x, (0,), 0.5)
    assert not nvfuser_ex.make_checker("sum", True)(x.bool(), (0,))
    cumsum, nextafter = nvfuser_ex.make_checker("cumsum", True), nvfuser_ex.make_checker("nextafter", True)
    assert cumsum(x, 0) and not cumsum(torch.ones(()), 0)  # nvFuser's scan takes no 0-dim tensor
    assert nextafter(x, x) and not nextafter(x.bfloat16(), x.bfloat16())
