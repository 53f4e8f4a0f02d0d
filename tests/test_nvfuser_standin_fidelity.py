"""The stand-in ``fake_nvfuser_direct`` against the source of ``nvfuser_direct`` 0.2.36 (NVIDIA/Fuser
81c4b22, ``python/version.txt`` 0.2.36): what it refuses and takes, each case citing the source file
and line that decides it, and what a fusion computes where the generated code differs from
torch's kernels (``pow``). Each check runs on the stand-in here and on the real bindings on a GPU
(``gpu``); the translator's ``pow`` is checked against eager bit for bit on both.

Divergences this file pins (each failed on the stand-in before it was fixed):

- dims out of range: nvFuser's ``wrapDim`` (csrc/base.h:578) refuses them with a RuntimeError in
  reductions, ``var``/``var_mean``, ``size``, ``index_select``; ``permute``'s ``normalizeNew2Old``
  (csrc/ir/utils.cpp:60) and ``cat`` (csrc/ops/alias.cpp:679) too. The stand-in wrapped a
  reduction's dims modulo the rank (``sum(x, [2])`` of a 2-d x summed dim 0) and raised torch's
  IndexError for the others;
- ``iota``'s constant start and step: finite, a step not 0 (csrc/ops/arith.cpp:427, 433, 438,
  internal asserts); the stand-in took them;
- ``pow`` of a constant exponent 1, 2 or 3 the op does not cast is multiplications in the generated
  code (csrc/codegen.cpp:1028 ``genPowerWithMul``); the stand-in called torch's pow of two tensors
  (``std::pow``: ``x ** 3.0`` not ``x * x * x``);
- the reductions' ``dim=`` keyword (ops.cpp:307) and the values pybind11 converts (a keepdim of
  None, a dim of True), and ``TensorView.size`` (ir.cpp:206): the stand-in refused them.

And the translator's, against eager (torch's kernels): ``pow`` of the exponents torch special-cases
(sqrt, rsqrt, reciprocal, products) and of numbers rounded to a half tensor's dtype, ``remainder``
by a number rounded so, and, on CUDA, ``div`` by a number as a product with its reciprocal.
"""

import warnings

import pytest
import torch

import thunder_rs

import fake_nvfuser_direct as fake

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # the named executor warns that the real nvfuser_direct is absent
    from thunder_rs.executors.nvfuser_ex import NvFuserExecutor


def _tensor(module, fd, shape=(2, 3), dtype="Float"):
    return fd.define_tensor(list(shape), [True] * len(shape), getattr(module.DataType, dtype))


def _index(module, fd):
    return _tensor(module, fd, shape=(2,), dtype="Int")


#: (what, define(module, fd), what the RuntimeError's message says): dims out of range, and iota's
#: constants. The source line deciding each is in its comment.
REFUSED = [
    # ops/utils.cpp:653 canonicalizeAxes -> base.h:578 wrapDim (reductionOp, arith.cpp:1378)
    ("sum over dim 2 of 2", lambda m, fd: fd.ops.sum(_tensor(m, fd), [2]), "out of boundary index 2"),
    ("sum over dim -3 of 2", lambda m, fd: fd.ops.sum(_tensor(m, fd), [-3]), "out of boundary index -1"),
    ("max over dim 5 of 2", lambda m, fd: fd.ops.max(_tensor(m, fd), 5), "out of boundary index 5"),
    ("prod over dims [0, 2]", lambda m, fd: fd.ops.prod(_tensor(m, fd), [0, 2]), "out of boundary index 2"),
    # normalization.cpp variance -> mean -> sum (and numFeatures, normalization.cpp:30): wrapDim
    ("var over dim 2 of 2", lambda m, fd: fd.ops.var(_tensor(m, fd), [2]), "out of boundary index 2"),
    ("var_mean over dim 2 of 2", lambda m, fd: fd.ops.var_mean(_tensor(m, fd), [2]), "out of boundary index 2"),
    # arith.cpp:1553 size: wrapDim (the stand-in: IndexError)
    ("size of dim 2 of 2", lambda m, fd: fd.ops.size(_tensor(m, fd), 2), "out of boundary index 2"),
    # indexing.cpp:77 indexSelect: wrapDim (the stand-in: IndexError)
    ("index_select along dim 2", lambda m, fd: fd.ops.index_select(_tensor(m, fd), _index(m, fd), 2), "index 2"),
    # ir/utils.cpp:60 normalizeNew2Old (the stand-in: torch's IndexError)
    ("permute [0, 2] of 2 dims", lambda m, fd: fd.ops.permute(_tensor(m, fd), [0, 2]), "New2Old axes are not"),
    # alias.cpp:679 cat (the stand-in: torch's IndexError)
    ("cat along dim 2 of 2", lambda m, fd: fd.ops.cat([_tensor(m, fd), _tensor(m, fd)], 2), "Invalid dimension"),
    # arith.cpp:438 iota: NVF_ERROR(!step->isConstScalar() || !step->isZero())
    ("iota of step 0", lambda m, fd: fd.ops.iota(4, 0, 0, m.DataType.Int), "step value must not equal zero"),
    ("iota of step 0.0", lambda m, fd: fd.ops.iota(4, 0.0, 0.0, m.DataType.Float), "step value must not equal"),
    # arith.cpp:427 and 433 iota: a constant floating start and step are finite
    ("iota from inf", lambda m, fd: fd.ops.iota(4, float("inf"), 1.0, m.DataType.Float), "must be finite"),
    ("iota of step nan", lambda m, fd: fd.ops.iota(4, 0.0, float("nan"), m.DataType.Double), "must be finite"),
]


def _check_refused(module, define, match):
    with pytest.raises(RuntimeError, match=match), module.FusionDefinition() as fd:
        define(module, fd)


@pytest.mark.parametrize(("what", "define", "match"), REFUSED, ids=[r[0] for r in REFUSED])
def test_the_stand_in_refuses_what_the_source_refuses(what, define, match):
    _check_refused(fake, define, match)


@pytest.mark.gpu
@pytest.mark.parametrize(("what", "define", "match"), REFUSED, ids=[r[0] for r in REFUSED])
def test_the_real_bindings_refuse_it(what, define, match, real_nvfuser):
    _check_refused(real_nvfuser, define, match)


def _taken(module, device):
    """What the same checks take: negative dims wrapped (base.h:574 wrapDim), any dim of a 0-dim
    tensor's reduction (arith.cpp:1375 reductionOpZeroDimTensor, before canonicalizeAxes), a
    negative iota step (arith.cpp:438 refuses only 0), a cat along -1 (alias.cpp:676)."""
    with module.FusionDefinition() as fd:
        x = _tensor(module, fd)
        s = _tensor(module, fd, shape=())
        i = _index(module, fd)
        fd.add_output(fd.ops.sum(x, [-2]))
        fd.add_output(fd.ops.sum(s, [5]))
        fd.add_output(fd.ops.var(x, [-1], 0))
        fd.add_output(fd.ops.permute(x, [-1, 0]))
        fd.add_output(fd.ops.cat([x, x], -1))
        fd.add_output(fd.ops.index_select(x, i, -2))
        fd.add_output(fd.ops.iota(fd.ops.size(x, -1), 2.0, -0.5, module.DataType.Float))
    x = torch.arange(6.0, device=device).reshape(2, 3)
    s = torch.tensor(4.0, device=device)
    i = torch.tensor([1, 0], device=device)
    summed, scalar, var, permuted, catted, selected, iota = fd.execute([x, s, i])
    expected = (x.sum(0), s, x.var(1, correction=0), x.t(), torch.cat([x, x], 1), x[[1, 0]])
    for got, want in zip((summed, scalar, var, permuted, catted, selected), expected):
        assert torch.equal(got, want)
    assert torch.equal(iota, torch.tensor([2.0, 1.5, 1.0], device=device))


def test_the_stand_in_takes_what_the_source_takes():
    _taken(fake, "cpu")


@pytest.mark.gpu
def test_the_real_bindings_take_it(real_nvfuser):
    _taken(real_nvfuser, "cuda")


def _converted_as_pybind11(module, device):
    """The reductions' int overload by its keyword (ops.cpp:307, ``py::arg("dim")``: the stand-in
    had one Python signature, of ``dims``, and refused ``dim=``); values pybind11's casters convert
    for the C++ parameters: a keepdim of None is False (``type_caster<bool>``'s conversion pass), a
    dim of True is 1 (the ``int`` caster takes a bool: ``PyLong_Check``; the stand-in handed
    both to torch, which refused them); ``TensorView.size`` (ir.cpp:206)."""
    with module.FusionDefinition() as fd:
        x = _tensor(module, fd)
        fd.add_output(fd.ops.sum(x, dim=0))
        fd.add_output(fd.ops.max(x, dim=1, keepdim=True))
        fd.add_output(fd.ops.prod(x, dim=-1, dtype=module.DataType.Double))
        fd.add_output(fd.ops.sum(x, [0], None))
        fd.add_output(fd.ops.sum(x, True))
        fd.add_output(fd.ops.iota(x.size(-1), 0, 1, module.DataType.Int))
    x = torch.arange(6.0, device=device).reshape(2, 3)
    outputs = fd.execute([x])
    expected = (x.sum(0), x.amax(1, keepdim=True), x.double().prod(-1), x.sum(0), x.sum(1), torch.arange(3))
    for got, want in zip(outputs, expected):
        assert got.dtype == want.dtype and torch.equal(got.cpu(), want.cpu())


def test_the_stand_in_takes_keywords_and_converts_values_as_pybind11():
    _converted_as_pybind11(fake, "cpu")


@pytest.mark.gpu
def test_the_real_bindings_take_keywords_and_convert_values(real_nvfuser):
    _converted_as_pybind11(real_nvfuser, "cuda")


# -- pow: what the generated code computes ------------------------------------------------------------


def _powers(module, device):
    """``pow`` of a constant exponent 2 or 3 that the op leaves uncast (type_promotion.cpp:246
    optionalCast: a Double constant of a Float op stays, a Python int is cast, castOp: not a
    constant) is ``x * x`` and ``x * x * x`` in the op's dtype (codegen.cpp:1028
    genPowerWithMul); an Int tensor's too; a cast exponent calls ``pow``."""
    with module.FusionDefinition() as fd:
        x = fd.define_tensor([-1], [True], module.DataType.Float)
        n = fd.define_tensor([-1], [True], module.DataType.Int)
        fd.add_output(fd.ops.pow(x, 3.0))
        fd.add_output(fd.ops.pow(x, fd.define_scalar(2.0, dtype=module.DataType.Float)))
        fd.add_output(fd.ops.pow(n, 3))
    torch.manual_seed(0)
    x = torch.rand(4096, device=device) * 4 + 0.5
    n = torch.arange(-50, 50, device=device)
    cubed, squared, int_cubed = fd.execute([x, n])
    assert torch.equal(cubed, x * x * x)  # (torch.pow's std::pow differs for some x)
    assert torch.equal(squared, x * x)
    assert torch.equal(int_cubed, n * n * n)


def test_the_stand_in_multiplies_constant_powers_as_the_generated_code():
    x = torch.rand(4096) * 4 + 0.5
    assert not torch.equal(torch.pow(x, torch.tensor(3.0)), x * x * x)  # the case is one that can fail
    _powers(fake, "cpu")


@pytest.mark.gpu
def test_the_real_bindings_multiply_constant_powers(real_nvfuser):
    _powers(real_nvfuser, "cuda")


#: Exponents torch's pow kernel computes as another op (PowKernel.cpp/.cu pow_tensor_scalar_kernel):
#: sqrt, rsqrt, reciprocal, and x * x, x * x * x, 1 / (x * x); and others, which it rounds to a
#: half tensor's dtype first (0.1 of a bfloat16 is 0.10009765625, 2.001 is 2: a square, 0.5001 is
#: 0.5 but not a sqrt).
EXPONENTS = (0.5, -0.5, -1, -1.0, 2, 2.0, 3, -2, 1.5, -3, 0.1, 1.3, 2.001, 0.5001)
#: float32 and float64, and bfloat16 (CPU's kernel squares in it; CUDA's Half too). CPU's float16
#: kernel calls std::pow in Half for every exponent, where CUDA's special-cases them: not compared.
POW_DTYPES = (torch.float32, torch.float64, torch.bfloat16)


def _translated_powers(executor, device):
    torch.manual_seed(0)
    for dtype in POW_DTYPES:
        x = (torch.rand(2048, device=device) * 4 + 0.25).to(dtype)
        for exponent in EXPONENTS:

            def program(a, e=exponent):
                return (a**e) * 1, (abs(e) ** a) * 1  # (a region of a few ops; a number base too)

            expected = program(x)
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # a region running eagerly warns
                actual = thunder_rs.jit(program, executors=[executor])(x)
            for got, want in zip(actual, expected):
                assert got.dtype == want.dtype and torch.equal(got, want), (dtype, exponent)
    assert executor.stats["failures"] == 0, executor.fallbacks


def test_powers_torch_special_cases_match_eager_bit_for_bit(fake_ex):
    """``x ** 0.5`` is torch's sqrt, bit for bit; nvFuser's ``pow`` is ``powf`` on CUDA and
    ``std::pow`` in the stand-in, which round otherwise (the translator emitted ``pow``)."""
    _translated_powers(fake_ex, "cpu")
    recorded = {op for d in fake.definitions for op in d.recorded}
    assert {"sqrt", "rsqrt", "reciprocal", "pow"} <= recorded


@pytest.mark.gpu
def test_on_cuda_powers_torch_special_cases_match_eager_bit_for_bit(real_nvfuser):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    _translated_powers(NvFuserExecutor("nvfuser_real", module=real_nvfuser), "cuda")


# -- numbers torch reads in a half tensor's dtype ----------------------------------------------------


def _remainders(executor, device):
    torch.manual_seed(0)
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        x = (torch.randn(2048, device=device) * 4).to(dtype)
        for number in (0.3, -0.7, 1.1):

            def program(a, n=number):
                return (a % n) * 1, (n % a) * 1

            expected = program(x)
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # a region running eagerly warns
                actual = thunder_rs.jit(program, executors=[executor])(x)
            for got, want in zip(actual, expected):
                assert got.dtype == want.dtype and torch.equal(got, want), (dtype, number)
    assert executor.stats["failures"] == 0, executor.fallbacks


def test_a_remainder_by_a_number_matches_eager_bit_for_bit(fake_ex):
    """torch's remainder kernels read a number in a half tensor's dtype (CUDA's
    BinaryRemainderKernel.cu ``gpu_kernel_with_scalars`` of ``scalar_t``, CPU's too): ``x % 0.3`` of
    a bfloat16 x is ``x % 0.30078125``. The region passed a Float 0.3."""
    _remainders(fake_ex, "cpu")


@pytest.mark.gpu
def test_on_cuda_a_remainder_by_a_number_matches_eager_bit_for_bit(real_nvfuser):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    _remainders(NvFuserExecutor("nvfuser_real", module=real_nvfuser), "cuda")


# -- division by a number: CUDA's kernel multiplies by its reciprocal ----------------------------------

DIVISORS = (0.3, 3, 7.0, -1e-3)


def _divisions(a):
    return tuple((a / d) * 1 for d in DIVISORS)


def _divisions_by_values(a, k, s):
    return (a / a.shape[0]) * 1, (a / k) * 1, (a / s) * 1, (a / a.shape[0] ** 0.5) * 1


def test_on_fake_cuda_a_division_by_a_number_is_a_product_with_its_reciprocal(monkeypatch, fake_cuda):
    """CUDA's div kernel computes a tensor divided by a CPU scalar as ``a * (1 / b)`` in opmath
    (BinaryDivTrueKernel.cu div_true_kernel_cuda: "may lose one bit of precision"), nvFuser's
    ``div`` divides: on CUDA tensors the region multiplies by the reciprocal (it divided)."""
    import sys  # noqa: PLC0415

    monkeypatch.setitem(sys.modules, "nvfuser_direct", fake)
    fake.definitions.clear()
    executor = NvFuserExecutor("nvfuser_fake_cuda", module=fake)
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        x = torch.randn(64, device="cuda", dtype=dtype)
        out = thunder_rs.jit(_divisions, executors=[executor])(x)
        assert [(o.dtype, o.device) for o in out] == [(x.dtype, x.device)] * len(DIVISORS)
    # A size, an int and a float argument and a float of sizes as divisors: reciprocals in the definition.
    sized = thunder_rs.jit(_divisions_by_values, executors=[executor], dynamic=True)
    for n in (3, 5, 7):
        sized(torch.randn(n, 4, device="cuda"), 3, 0.7)
    recorded = [op for d in fake.definitions for op in d.recorded]
    assert {"mul", "reciprocal"} <= set(recorded) and "div" not in recorded, recorded
    assert executor.stats["failures"] == 0, executor.fallbacks


def _doubles_and_slices(a):
    return (a * 0.1 + 1e-3) * 1, a[1:3].exp() * 2, a[:, 2:].sum(0) * 0.5, torch.cat([a[:1], a[-1:] * 3.5])


def test_on_fake_cuda_double_constants_and_slices_define_and_run(monkeypatch, fake_cuda):
    """A float64 tensor's Python floats stay Double constants and a slice is ``ops.slice``: the
    stand-in made each on fake CUDA tensors with ``torch.tensor`` and ``Tensor.__getitem__``, which
    need a CUDA driver ("Found no NVIDIA driver", "CUDA driver version is insufficient"), and the
    regions ran eagerly; nvFuser defines and runs both."""
    import sys  # noqa: PLC0415

    monkeypatch.setitem(sys.modules, "nvfuser_direct", fake)
    fake.definitions.clear()
    executor = NvFuserExecutor("nvfuser_fake_cuda", module=fake)
    for dtype in (torch.float64, torch.float32, torch.bfloat16):
        x = torch.randn(5, 8, device="cuda", dtype=dtype)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a region running eagerly warns
            out = thunder_rs.jit(_doubles_and_slices, executors=[executor])(x)
        expected = _doubles_and_slices(torch.empty(5, 8, device="meta", dtype=dtype))  # (eager's indexing needs CUDA)
        assert [(o.dtype, o.shape, o.device.type) for o in out] == [(e.dtype, e.shape, "cuda") for e in expected]
    recorded = {op for d in fake.definitions for op in d.recorded}
    assert {"slice", "define_scalar"} <= recorded, recorded
    assert executor.stats["failures"] == 0, executor.fallbacks


def test_on_the_cpu_a_division_by_a_number_divides_as_torchs_cpu_kernel(fake_ex):
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        x = torch.randn(2048, dtype=dtype)
        actual, expected = thunder_rs.jit(_divisions, executors=[fake_ex])(x), _divisions(x)
        assert all(torch.equal(a, e) for a, e in zip(actual, expected))
    assert "div" in {op for d in fake.definitions for op in d.recorded}


@pytest.mark.gpu
def test_on_cuda_a_division_by_a_number_matches_eager_bit_for_bit(real_nvfuser):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    executor = NvFuserExecutor("nvfuser_real", module=real_nvfuser)
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        x = (torch.randn(1 << 16, device="cuda") * 100).to(dtype)
        actual, expected = thunder_rs.jit(_divisions, executors=[executor])(x), _divisions(x)
        for a, e, d in zip(actual, expected, DIVISORS):
            assert a.dtype == e.dtype and torch.equal(a, e), (dtype, d)
    assert executor.stats["failures"] == 0, executor.fallbacks
