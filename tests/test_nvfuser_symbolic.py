"""Regions of a symbolic trace in the nvFuser executor: one definition per region serves every
length (``nvfuser_symbolic``), outputs and gradients equal to eager, floats computed from sizes
(``x * T ** -0.5``) as Double inputs computed on the host; the bindings' symbolic extents, scalar
inputs and their errors, the stand-in's against the real module's (``gpu``)."""

import dataclasses
import warnings

import numpy
import pytest
import torch

import thunder_rs
from thunder_rs._core import SymExpr
from thunder_rs.core.lang.symfloat import SymFloat, text
from thunder_rs.errors import ThunderNotImplementedError

import fake_nvfuser_direct as fake

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # the named executor warns that the real nvfuser_direct is absent
    from thunder_rs.executors.nvfuser_ex import NvFuserExecutor, NvFuserRegion
    from thunder_rs.executors.nvfuser_symbolic import host_floats, symbolic_dims

LENGTHS = (3, 5, 7, 9, 4)


@pytest.fixture
def real_ex(real_nvfuser):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return NvFuserExecutor("nvfuser_real", module=real_nvfuser)


def _recording(executor) -> list:
    """The ``NvFuserRegion``s ``executor`` makes from now on."""
    fused, fuse = [], executor.fuse
    executor.fuse = lambda region: fused.append(fuse(region)) or fused[-1]
    return fused


def _symbolic(fused) -> list:
    return [r for r in fused if any(symbolic_dims(r.region.input_shapes))]


def gelu_softmax(x, w):
    y = torch.nn.functional.gelu(x @ w) * 2 + x.sum(-1, keepdim=True)
    return y.reshape(x.shape[0], -1).softmax(-1)


MASK = torch.ones(16, 16, dtype=torch.bool).tril()


def causal_attention(x, wq, wv):
    """A causal attention block whose T x T mask is built in the program (iota, broadcasts) and
    sliced from a buffer (slice bounds T)."""
    b, t, c = x.shape
    q = (x @ wq).view(b, t, 2, c // 2).transpose(1, 2)
    v = (x @ wv).view(b, t, 2, c // 2).transpose(1, 2)
    pos = torch.arange(t, device=x.device)
    mask = (pos[:, None] >= pos[None, :]) & MASK.to(x.device)[:t, :t]
    scores = (q @ q.transpose(-1, -2) / 2.0).masked_fill(~mask, float("-inf")).softmax(-1)
    return torch.nn.functional.layer_norm((scores @ v).transpose(1, 2).reshape(b, t, c), (c,)) + x


def _check_against_eager(fn, shapes, params, executor, device="cpu", **jit_options) -> object:
    """``fn`` jitted with ``executor`` at each of ``shapes`` (the first argument's), outputs and
    gradients of every input equal to eager's, no region falling back; returns the jitted function."""
    jfn = thunder_rs.jit(fn, executors=[executor, "torch"], **jit_options)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a region running eagerly warns
        for shape in shapes:
            x = torch.randn(*shape, device=device, requires_grad=True)
            inputs = [x, *params]
            expected = fn(*inputs)
            grads = torch.autograd.grad(expected.square().sum(), inputs)
            actual = jfn(*inputs)
            torch.testing.assert_close(actual, expected)
            # Gradients are sums in another order than eager's (the decomposed layer norm's).
            torch.testing.assert_close(torch.autograd.grad(actual.square().sum(), inputs), grads, rtol=1e-4, atol=1e-4)
    assert executor.stats["failures"] == 0, executor.fallbacks
    return jfn


def _params(*shapes, device="cpu"):
    return [torch.randn(*s, device=device, requires_grad=True) for s in shapes]


def test_a_changing_length_defines_each_region_once(fake_ex):
    fused = _recording(fake_ex)
    jfn = _check_against_eager(gelu_softmax, [(n, 8) for n in LENGTHS], _params((8, 8)), fake_ex)
    assert thunder_rs.compile_stats(jfn).cache_misses == 2  # a static compile, then the symbolic one
    symbolic = _symbolic(fused)
    assert len(symbolic) >= 2, [r.region.name for r in fused]  # forward and backward
    assert [len(r.definitions) for r in symbolic] == [1] * len(symbolic)
    # The static compile's regions and the symbolic ones', each defined once.
    assert fake_ex.stats["definitions"] == len(fused)


def test_a_causal_attention_block_defines_each_region_once(fake_ex):
    fused = _recording(fake_ex)
    jfn = _check_against_eager(
        causal_attention, [(2, n, 8) for n in LENGTHS], _params((8, 8), (8, 8)), fake_ex, dynamic=True
    )
    assert thunder_rs.compile_stats(jfn).cache_misses == 1
    assert fused and _symbolic(fused) == fused
    assert fake_ex.stats["definitions"] == len(fused)
    calls = [call for r in fused for call in r.region.calls]
    for prim in ("prims.iota", "prims.slice", "prims.broadcast_in_dim", "prims.reshape"):
        assert any(c.name == prim and _has_symbolic(c.args) for c in calls), prim


def mean_pooled(x, w):
    """Mean pooling over a length: the mean divides by the symbolic length, a size input."""
    return (x @ w).tanh().mean(1) * x.shape[1]


def test_a_mean_over_a_changing_length_divides_by_the_size_input(fake_ex):
    fused = _recording(fake_ex)
    jfn = _check_against_eager(mean_pooled, [(2, n, 8) for n in LENGTHS], _params((8, 8)), fake_ex, dynamic=True)
    assert thunder_rs.compile_stats(jfn).cache_misses == 1
    calls = [call for r in fused for call in r.region.calls]
    assert any(c.name == "prims.div" and _has_symbolic(c.args) for c in calls)


def _has_symbolic(args) -> bool:
    return any(isinstance(a, SymExpr) or (isinstance(a, (tuple, list)) and _has_symbolic(a)) for a in args)


def test_a_region_reading_a_size_it_cannot_bind_runs_eagerly_and_exactly(fake_ex):
    # The partition gives a region the size values its prims read, so a region built by jit binds
    # all of them: this one is made so, its inputs' shapes naming only 2*t0 where its calls read t0.
    fused = _recording(fake_ex)
    jfn = thunder_rs.jit(gelu_softmax, executors=[fake_ex, "torch"], dynamic=True)
    x, w = torch.randn(5, 8), torch.randn(8, 8)
    jfn(x, w)
    region = next(r.region for r in fused if any(isinstance(s, SymExpr) for s in r.region.input_shapes))

    def doubled(shape):
        if isinstance(shape, SymExpr):
            return None
        return shape if shape is None else tuple(2 * s if isinstance(s, SymExpr) else s for s in shape)

    unbound = NvFuserRegion(dataclasses.replace(region, input_shapes=tuple(map(doubled, region.input_shapes))), fake_ex)
    args = [torch.randn(5, 8) if isinstance(s, tuple) else 5 for s in region.input_shapes]
    with pytest.warns(UserWarning, match="reads the size t0, which is neither"):
        actual = unbound(*args)
    torch.testing.assert_close(actual, region.function(*args), rtol=0, atol=0)
    assert fake_ex.stats["failures"] == 1


def test_another_layout_at_a_new_length_is_defined_again(fake_ex):
    # The layout of a symbolic region holds no extents but where its inputs' broadcasts are and how
    # their dims are laid out: a column-major input at another length gets a definition of its own.
    fused = _recording(fake_ex)
    jfn = thunder_rs.jit(gelu_softmax, executors=[fake_ex, "torch"])
    for n in (3, 5):  # the second compile is symbolic in x.shape[0] only: its regions take (n, 8) tensors
        jfn(torch.randn(n, 8), torch.randn(8, 8))
    region = next(r for r in fused if any(symbolic_dims(r.region.input_shapes)))
    assert all(s == (s[0], 8) for s in region.region.input_shapes if isinstance(s, tuple))
    for n, column_major in ((6, False), (7, True), (9, True)):
        args = [
            (torch.randn(8, n).t() if column_major else torch.randn(n, 8)) if isinstance(s, tuple) else n
            for s in region.region.input_shapes
        ]
        torch.testing.assert_close(region(*args), region.region.function(*args))
    assert len(region.definitions) == 2 and fake_ex.stats["failures"] == 0


def test_a_static_region_keeps_its_layout_with_sizes(fake_ex):
    fused = _recording(fake_ex)
    jfn = thunder_rs.jit(gelu_softmax, executors=[fake_ex, "torch"])
    jfn(torch.randn(3, 8), torch.randn(8, 8))
    (region,) = fused
    (key,) = region.definitions
    assert torch.Size([3, 8]) in key


# -- the bindings: symbolic extents, scalar inputs and their errors ------------------------------------


def _symbolic_definition(module):
    """A definition over an [n, 8] tensor (n symbolic), an Int scalar k (= n) and an [n // 2]
    tensor h: reshape to [n * 8], an iota of n, a full of [k, 2], x[: k - 1] padded back by one
    row, (n - 9) // 4 as Python floors it (a negative dividend) through div and mod, and the first
    k // 2 of x's first column plus h (extents nvFuser relates only when it executes)."""
    with module.FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, 8], contiguity=[True, True], dtype=module.DataType.Float)
        k = fd.define_scalar(dtype=module.DataType.Int)
        h = fd.define_tensor(shape=[-1], contiguity=[True], dtype=module.DataType.Float)
        n = fd.ops.size(x, 0)
        fd.add_output(fd.ops.reshape(x, [fd.ops.mul(n, 8)]))
        fd.add_output(fd.ops.iota(n, 0, 1, module.DataType.Int))
        fd.add_output(fd.ops.full([k, 2], 1.5, module.DataType.Float))
        head = fd.ops.slice(x, [0, 0], [fd.ops.sub(k, 1), 8])
        fd.add_output(fd.ops.pad(head, [0, 0, 0, fd.ops.sub(n, fd.ops.sub(k, 1))]))
        p = fd.ops.sub(n, 9)
        remainder = fd.ops.mod(fd.ops.add(fd.ops.mod(p, 4), 4), 4)
        fd.add_output(fd.ops.iota(fd.ops.add(fd.ops.div(fd.ops.sub(p, remainder), 4), 3), 0, 1, module.DataType.Int))
        column = fd.ops.reshape(fd.ops.slice(x, [0, 0], [fd.ops.div(k, 2), 1]), [fd.ops.div(k, 2)])
        fd.add_output(fd.ops.add(column, h))
    return fd


def _check_symbolic_definition(module, device):
    fd = _symbolic_definition(module)
    for n in (4, 6, 11):
        x = torch.randn(n, 8, device=device)
        h = torch.randn(n // 2, device=device)
        flat, iota, full, padded, floored, added = fd.execute([x, n, h])
        torch.testing.assert_close(flat, x.reshape(-1))
        torch.testing.assert_close(iota, torch.arange(n, device=device))
        torch.testing.assert_close(full, torch.full((n, 2), 1.5, device=device))
        torch.testing.assert_close(padded, torch.cat([x[: n - 1], torch.zeros(1, 8, device=device)]))
        assert floored.shape == ((n - 9) // 4 + 3,)
        torch.testing.assert_close(added, x[: n // 2, 0] + h)


def _check_symbolic_misuse(module, device):
    fd = _symbolic_definition(module)
    x, h = torch.randn(4, 8, device=device), torch.randn(2, device=device)
    with pytest.raises(Exception, match="Inputs were not set up correctly"):
        fd.execute([x])
    with pytest.raises(Exception, match="is not compatible with the expected data type"):
        fd.execute([x, 4.0, h])
    # The bindings read a Python int, bool, float or complex (or a subclass: a NumPy float64), and
    # flatten a list or tuple among the inputs; a NumPy int64 is not an int to them.
    with pytest.raises(Exception, match="Cannot convert provided py::handle to a PolymorphicValue"):
        fd.execute([x, numpy.int64(4), h])
    with pytest.raises(Exception, match="is not compatible with the expected data type"):
        fd.execute([x, True, h])  # a bool is a Bool, not an integral scalar
    torch.testing.assert_close(fd.execute([(x, 4), [h]])[-1], fd.execute([x, 4, h])[-1])
    with module.FusionDefinition() as fd:
        y = fd.define_tensor(shape=[-1, 8], contiguity=[True, True], dtype=module.DataType.Float)
        fd.add_output(fd.ops.mul(y, 2.0))
    with pytest.raises(Exception, match="Tried to bind to a constant value: 8 as 9"):
        fd.execute([torch.randn(4, 9, device=device)])
    with pytest.raises(Exception, match="was neither symbolic"), module.FusionDefinition() as fd:
        fd.define_tensor(shape=[-2, 8], contiguity=[True, True], dtype=module.DataType.Float)


def test_the_stand_in_takes_symbolic_extents_and_scalar_inputs():
    _check_symbolic_definition(fake, "cpu")


def test_the_stand_in_refuses_symbolic_misuse_as_nvfuser_does():
    _check_symbolic_misuse(fake, "cpu")


@pytest.mark.gpu
def test_the_real_bindings_take_symbolic_extents_and_scalar_inputs(real_nvfuser):
    _check_symbolic_definition(real_nvfuser, "cuda")


@pytest.mark.gpu
def test_the_real_bindings_refuse_the_same_symbolic_misuse(real_nvfuser):
    _check_symbolic_misuse(real_nvfuser, "cuda")


@pytest.mark.gpu
def test_on_cuda_a_changing_length_defines_each_region_once(real_ex):
    fused = _recording(real_ex)
    params = _params((8, 8), device="cuda")
    jfn = _check_against_eager(gelu_softmax, [(n, 8) for n in LENGTHS], params, real_ex, device="cuda")
    assert thunder_rs.compile_stats(jfn).cache_misses == 2
    symbolic = _symbolic(fused)
    assert symbolic and [len(r.definitions) for r in symbolic] == [1] * len(symbolic)


@pytest.mark.gpu
def test_on_cuda_a_causal_attention_block_defines_each_region_once(real_ex):
    fused = _recording(real_ex)
    params = _params((8, 8), (8, 8), device="cuda")
    _check_against_eager(causal_attention, [(2, n, 8) for n in LENGTHS], params, real_ex, device="cuda", dynamic=True)
    assert fused and real_ex.stats["definitions"] == len(fused)


@pytest.mark.gpu
def test_on_cuda_a_mean_over_a_changing_length_divides_by_the_size_input(real_ex):
    fused = _recording(real_ex)
    params = _params((8, 8), device="cuda")
    _check_against_eager(mean_pooled, [(2, n, 8) for n in LENGTHS], params, real_ex, device="cuda", dynamic=True)
    assert fused and real_ex.stats["definitions"] == len(fused)


def scaled_by_count(x, w, n):
    """An int argument as a size and as a scalar: a slice to it, a product with it, a division by it."""
    y = x[:, :n] @ w[:n]
    return y.tanh() * n + y.sum(-1, keepdim=True) / n


def _over_counts(executor, device="cpu") -> list:
    """``scaled_by_count`` jitted with ``executor`` over changing ints, outputs and gradients equal
    to eager's, no region falling back; returns the regions it fused."""
    fused = _recording(executor)
    jfn = thunder_rs.jit(scaled_by_count, executors=[executor, "torch"])
    torch.manual_seed(0)
    x, w = torch.randn(4, 12, device=device), torch.randn(12, 8, device=device, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a region running eagerly warns
        for n in (3, 5, 7, 9, 11, 4):
            actual, expected = jfn(x, w, n), scaled_by_count(x, w, n)
            torch.testing.assert_close(actual, expected)
            torch.testing.assert_close(
                torch.autograd.grad(actual.sum(), w), torch.autograd.grad(expected.sum(), w), rtol=1e-4, atol=1e-5
            )
    assert thunder_rs.compile_stats(jfn).cache_misses == 2
    assert executor.stats["failures"] == 0, executor.fallbacks
    return fused


def test_an_int_argument_is_a_size_input_of_the_regions(fake_ex):
    fused = _over_counts(fake_ex)
    assert _symbolic(fused) and fake_ex.stats["definitions"] == len(fused)


@pytest.mark.gpu
def test_on_cuda_an_int_argument_is_a_size_input_of_the_regions(real_ex):
    fused = _over_counts(real_ex, device="cuda")
    assert _symbolic(fused) and real_ex.stats["definitions"] == len(fused)


def lm_loss(x, w):
    """A language model's loss over a changing length: cross entropy against targets (a
    ``take_along_axis`` whose index has the logits' symbolic sizes but one)."""
    logits = (x @ w).reshape(-1, w.shape[1])
    targets = torch.arange(logits.shape[0], device=x.device) % w.shape[1]
    return torch.nn.functional.cross_entropy(logits, targets, reduction="none").reshape(x.shape[:2])


def test_cross_entropy_over_a_changing_length_is_defined_once(fake_ex):
    # The take_along_axis checker compared symbolic sizes with ==, a decision after tracing:
    # the symbolic compile failed and the function compiled per length.
    fused = _recording(fake_ex)
    jfn = _check_against_eager(lm_loss, [(2, n, 8) for n in LENGTHS], _params((8, 6)), fake_ex)
    assert thunder_rs.compile_stats(jfn).cache_misses == 2 and jfn._dynamic_off is None
    calls = [call.name for r in _symbolic(fused) for call in r.region.calls]
    assert "prims.take_along_axis" in calls


def pieces_of(x, n):
    """A split into a changing number of pieces of a fixed-size input: slices whose bounds are
    multiples of a size input, of an input whose extent is constant."""
    return torch.cat([p.tanh() * 2 for p in torch.split(x, n, dim=1)], 1)


def test_slices_of_a_constant_extent_at_symbolic_bounds_are_defined(fake_ex):
    # The stand-in took the bounds' define-time samples against the constant extent (12 - 2 * 840).
    fused = _recording(fake_ex)
    jfn = thunder_rs.jit(pieces_of, executors=[fake_ex, "torch"])
    x = torch.randn(3, 12, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for n in (4, 5, 6):
            actual, expected = jfn(x, n), pieces_of(x, n)
            torch.testing.assert_close(actual, expected)
            torch.testing.assert_close(torch.autograd.grad(actual.sum(), x), torch.autograd.grad(expected.sum(), x))
    assert fake_ex.stats["failures"] == 0, fake_ex.fallbacks
    assert _symbolic(fused)


@pytest.mark.gpu
def test_on_cuda_cross_entropy_over_a_changing_length_is_defined_once(real_ex):
    params = _params((8, 6), device="cuda")
    jfn = _check_against_eager(lm_loss, [(2, n, 8) for n in LENGTHS], params, real_ex, device="cuda")
    assert thunder_rs.compile_stats(jfn).cache_misses == 2 and jfn._dynamic_off is None


@pytest.mark.gpu
def test_on_cuda_slices_of_a_constant_extent_at_symbolic_bounds_are_defined(real_ex):
    jfn = thunder_rs.jit(pieces_of, executors=[real_ex, "torch"])
    x = torch.randn(3, 12, device="cuda", requires_grad=True)
    for n in (4, 5, 6):
        actual, expected = jfn(x, n), pieces_of(x, n)
        torch.testing.assert_close(actual, expected)
        torch.testing.assert_close(torch.autograd.grad(actual.sum(), x), torch.autograd.grad(expected.sum(), x))
    assert real_ex.stats["failures"] == 0, real_ex.fallbacks


def rows_scaled(x, m):
    """Rows a mask selects (a count, which may be 0 or 1) through a fused region."""
    y = x[m]
    return (y * 2).tanh() + y.sum(-1, keepdim=True)


def _over_row_counts(executor, device="cpu") -> list:
    """``rows_scaled`` over counts 0 and 1 among others: eager's outputs and gradients, two
    compiles, no region falling back; the empty rows defined apart. Returns the regions."""
    fused = _recording(executor)
    jfn = thunder_rs.jit(rows_scaled, executors=[executor, "torch"])
    x = torch.randn(16, 8, device=device, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a region running eagerly warns
        for n in (4, 6, 0, 5, 1, 0, 9):
            m = torch.zeros(16, dtype=torch.bool, device=device)
            m[torch.randperm(16)[:n]] = True
            actual, expected = jfn(x, m), rows_scaled(x, m)
            torch.testing.assert_close(actual, expected)
            torch.testing.assert_close(torch.autograd.grad(actual.sum(), x), torch.autograd.grad(expected.sum(), x))
    assert thunder_rs.compile_stats(jfn).cache_misses == 2, thunder_rs.compile_stats(jfn).miss_reasons
    assert executor.stats["failures"] == 0, executor.fallbacks
    return fused


def test_a_count_of_0_reaching_a_symbolic_region_has_a_definition_of_its_own(fake_ex):
    fused = _over_row_counts(fake_ex)
    (region,) = [r for r in _symbolic(fused) if "tanh" in str(r.region.calls)]
    # each tensor's sizes follow its dtype in a definition's key: -1 where symbolic
    sizes = [[k[i + 1] for i, x in enumerate(k) if isinstance(x, torch.dtype)] for k in region.definitions]
    assert [(16, 8), (-1,)] in sizes and [(16, 8), (0,)] in sizes, sizes


@pytest.mark.gpu
def test_on_cuda_a_count_of_0_reaching_a_symbolic_region_has_a_definition_of_its_own(real_ex):
    _over_row_counts(real_ex, device="cuda")


# -- floats computed from sizes: Double inputs computed on the host ------------------------------------

FLOAT_SIZES = (4, 6, 9, 12, 16)


def scaled_chain(x):
    """``x * T ** -0.5`` between elementwise ops: one region, which takes the float as an input."""
    return (x.cos() * x.shape[-1] ** -0.5).sin() + 1.0


def clamped_by_size(x):
    """A clamp to a float of sizes and a comparison with it, which torch reads in x's dtype: a
    bfloat16 0.9 is below 0.9, and the clamped elements are at least it as bfloat16s."""
    y = x.clamp(max=x.shape[-1] / 10)
    return torch.where(y >= x.shape[-1] / 10, y * 2, y.exp())


def scaled_attention(x):
    """An attention whose scale comes from its changing head dim (the matmuls stay with torch)."""
    q, k, v = x.sin(), x.cos(), x * 2
    scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    return scores.softmax(-1) @ v


#: name -> (program, shape of its input at size T)
FLOAT_PROGRAMS = {
    "x * T ** -0.5": (scaled_chain, lambda T: (3, T)),
    "clamp(max=T / 10)": (clamped_by_size, lambda T: (3, T)),
    "attention": (scaled_attention, lambda T: (2, 2, 5, T)),
}


def _floats_of(region) -> set:
    """The texts of the floats of sizes among a region's calls' arguments."""
    return {text(a.ops) for c in region.calls for a in c.args if type(a) is SymFloat}


def _check_floats_of_sizes(executor, name, dtype, device="cpu") -> list:
    """``FLOAT_PROGRAMS[name]`` jitted with ``executor`` at growing sizes: outputs (and gradients,
    but for bfloat16) as eager's, at most two compiles, each region defined once, and every float of
    sizes taken by a region (none left to a torch call). Returns the regions taking one."""
    fn, shape_of = FLOAT_PROGRAMS[name]
    fused = _recording(executor)
    jfn = thunder_rs.jit(fn, executors=[executor, "torch"])
    grads = dtype != torch.bfloat16
    # The stand-in computes each op as torch does; the attention's softmax is decomposed (sums in
    # another order than eager's kernel), and nvFuser's sin and exp are not CUDA's.
    exact = {"rtol": 0, "atol": 0} if name != "attention" and device == "cpu" else {}
    tol = {"rtol": 1e-4, "atol": 1e-5} if not exact and dtype == torch.float32 else exact
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a region running eagerly warns
        for T in FLOAT_SIZES:
            torch.manual_seed(T)
            x = torch.randn(*shape_of(T), dtype=dtype, device=device, requires_grad=grads)
            actual, expected = jfn(x), fn(x)
            torch.testing.assert_close(actual, expected, **exact)
            assert actual.dtype == expected.dtype and actual.stride() == expected.stride()
            if grads:
                cot = torch.randn_like(expected)
                grad, expected_grad = torch.autograd.grad(actual, x, cot), torch.autograd.grad(expected, x, cot)
                torch.testing.assert_close(grad, expected_grad, **tol)
    assert thunder_rs.compile_stats(jfn).cache_misses <= 2, thunder_rs.compile_stats(jfn).miss_reasons
    assert executor.stats["failures"] == 0, executor.fallbacks
    taking = [r for r in fused if _floats_of(r.region)]
    assert taking and [len(r.definitions) for r in taking] == [1] * len(taking)
    assert executor.stats["definitions"] == len(fused)
    floats = set().union(*(_floats_of(r.region) for r in taking))
    traces = [thunder_rs.last_traces(jfn)[-1]] + (thunder_rs.last_backward_traces(jfn)[-1:] if grads else [])
    for trace in traces:
        calls = [line for line in str(trace).splitlines() if not line.lstrip().startswith("#")]
        assert not [line for line in calls if any(f in line for f in floats)], str(trace)
    return taking


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("name", FLOAT_PROGRAMS)
def test_a_float_of_sizes_is_a_double_input_of_one_definition(fake_ex, name, dtype):
    # float32 and bfloat16: computed in float32 with the float rounded on the host as a constant
    # float is (to float32; to bfloat16 for the clamp's bound and the comparison).
    taking = _check_floats_of_sizes(fake_ex, name, dtype)
    if name == "x * T ** -0.5":  # the forward chain is one region: the float did not split it
        chain = {"prims.cos", "prims.mul", "prims.sin", "prims.add"}
        assert any(chain <= {c.name for c in r.region.calls} for r in taking)


def test_host_floats_read_a_size_input_else_an_extent_and_round_as_constants(fake_ex):
    fused = _recording(fake_ex)
    jfn = thunder_rs.jit(scaled_chain, executors=[fake_ex, "torch"])
    for T in (4, 6):
        jfn(torch.randn(3, T))
    (region,) = [r.region for r in fused if _floats_of(r.region)]
    (scale,) = _floats_of(region)
    floats = [(scale, dtype) for dtype in (torch.float64, torch.float32, torch.bfloat16)]
    expected = tuple(float(torch.tensor(9**-0.5, dtype=dtype)) for _, dtype in floats)
    args = [torch.randn(3, 9) if isinstance(s, tuple) else 9 for s in region.input_shapes]
    assert host_floats("r", region.input_shapes, floats)(args) == expected
    assert expected[0] == 9**-0.5 and len(set(expected)) == 3
    (shape,) = [s for s in region.input_shapes if isinstance(s, tuple)]  # the size from x.shape[1] alone
    assert host_floats("r", (shape,), floats)([torch.randn(3, 9)]) == expected
    with pytest.raises(ThunderNotImplementedError, match="region r computes a float from the size t"):
        host_floats("r", ((3, 9),), floats)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", FLOAT_PROGRAMS)
def test_on_cuda_a_float_of_sizes_is_a_double_input(real_ex, name, dtype):
    _check_floats_of_sizes(real_ex, name, dtype, device="cuda")


def _check_double_scalar_input(module, device):
    """A Float tensor times a Double scalar input: nvFuser computes it in double (a floating scalar
    is not cast to the tensor's type, ``optionalCast``) and rounds, where torch computes
    ``x * s`` in float32; the scalar cast to Float computes as torch."""
    with module.FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1], contiguity=[True], dtype=module.DataType.Float)
        s = fd.define_scalar(dtype=module.DataType.Double)
        fd.add_output(fd.ops.mul(x, s))
        fd.add_output(fd.ops.mul(x, fd.ops.cast(s, module.DataType.Float)))
    torch.manual_seed(0)
    for n in (7, 1000):
        x, scale = torch.randn(n, device=device), n**-0.5
        in_double, in_float = fd.execute([x, scale if n == 7 else numpy.float64(scale)])  # a float to the bindings
        assert in_double.dtype == in_float.dtype == torch.float32
        torch.testing.assert_close(in_double, (x.double() * scale).float(), rtol=0, atol=0)
        torch.testing.assert_close(in_float, x * scale, rtol=0, atol=0)
    assert not torch.equal(in_double, in_float)  # the two differ in the last bit somewhere


def test_the_stand_in_computes_a_double_scalar_input_as_nvfuser_does():
    _check_double_scalar_input(fake, "cpu")


@pytest.mark.gpu
def test_the_real_bindings_compute_a_double_scalar_input_so(real_nvfuser):
    _check_double_scalar_input(real_nvfuser, "cuda")
