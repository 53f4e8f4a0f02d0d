"""The Inductor executor end to end: ``thunder_rs.jit(fn, executors=["inductor"])`` runs the
regions the partitioner makes compiled by Inductor, with eager's outputs and gradients (half
precision rounded per op, OpInfo samples' gradients, symbolic sizes); the regions built by hand
are ``test_inductor_ex.py``'s.
"""

import pytest
import torch

import thunder_rs
from thunder_rs.executors import inductor_ex
import test_ops
from test_training import assert_nanogpt_trains_like_eager
import gpt  # examples/, on the path test_training sets
from test_inductor_ex import assert_same

pytestmark = pytest.mark.inductor


# -- end to end: jit(fn, executors=["inductor"]) ---------------------------------------------------


def _half_chain(x, y, z):
    """Ops whose float32 results eager rounds to x's dtype one by one, a float32 result of a
    rounded product, and Python numbers, which eager's kernels read in float32 as the second
    operand (and on the CPU in x's dtype as the first: ``0.7 - ...``). Inductor's fused kernel
    keeps the results in float32 unless it emulates the casts, and then rounds the numbers."""
    return ((x * y + z) * 1.1 - x) / (z.abs() + 1), (x * y).float() + 1, (0.7 - x * 0.3) / 3.3


def _check_half_precision_regions_round_as_eager(device, program=_half_chain):
    """The region equals eager bit for bit in bfloat16 and float16 though the process's Inductor
    setting says not to emulate eager's casts: the policy is the executor's own, and the process's
    setting is left as it was. Without it, a third of the elements differ; with it but with the
    numbers as Inductor reads them, one in seven."""
    from torch._inductor import config  # noqa: PLC0415 (Inductor is imported by the executor anyway)

    jfn = thunder_rs.jit(program, executors=["inductor"])
    torch.manual_seed(0)
    with config.patch(emulate_precision_casts=False):
        for dtype in (torch.bfloat16, torch.float16):
            x, y, z = (torch.randn(1000, dtype=dtype, device=device) for _ in range(3))
            for actual, expected in zip(jfn(x, y, z), program(x, y, z)):
                assert actual.dtype == expected.dtype and torch.equal(actual, expected), (dtype, actual - expected)
        assert config.emulate_precision_casts is False
    assert [r.name for r in thunder_rs.last_traces(jfn)[-1].regions()] == ["inductor_fusion0"]


def test_half_precision_regions_round_each_op_as_eager(one_thread):
    _check_half_precision_regions_round_as_eager("cpu")


@pytest.mark.gpu
def test_on_cuda_half_precision_regions_round_each_op_as_eager():
    # Multiplies and adds only: CUDA's and Triton's division (eager's multiplies by a number's
    # reciprocal) and transcendental functions are not bit for bit the same in float32.
    _check_half_precision_regions_round_as_eager(
        "cuda", lambda x, y, z: ((x * y + z) * 1.1 - x, (x * y).float() + 1, 0.7 - x * 0.3)
    )


def _chain(x, y):
    a = torch.sin(x) * y + 1.0
    b = torch.tanh(a) - torch.exp(-a)
    return (b * b).sum(dim=-1), torch.softmax(b, -1) @ y.t()


def test_jit_with_inductor_runs_regions_compiled_by_inductor_with_eagers_outputs_and_gradients(one_thread):
    jfn = thunder_rs.jit(_chain, executors=["inductor"])
    x, y = torch.randn(8, 16, requires_grad=True), torch.randn(8, 16, requires_grad=True)
    xe, ye = x.detach().clone().requires_grad_(), y.detach().clone().requires_grad_()
    before = inductor_ex.stats().misses
    out, ref = jfn(x, y), _chain(xe, ye)
    assert_same(tuple(out), tuple(t.detach() for t in ref))
    cotangents = [torch.randn_like(r) for r in ref]
    torch.autograd.backward(out, cotangents)
    torch.autograd.backward(ref, cotangents)
    torch.testing.assert_close((x.grad, y.grad), (xe.grad, ye.grad))
    # One region each way, matmuls and views inside, compiled once each.
    for trace in (thunder_rs.last_traces(jfn)[-1], thunder_rs.last_backward_traces(jfn)[-1]):
        assert [region.name for region in trace.regions()] == ["inductor_fusion0"]
    assert inductor_ex.stats().misses == before + 2
    jfn(x, y)
    assert inductor_ex.stats().misses == before + 2


def test_repeated_layers_make_regions_with_one_key(monkeypatch):
    """Regions end at the attention kernel (left to the torch executor), so a GPT's regions are
    embeddings and the first layer's attention inputs; one layer's attention output, MLP and the
    next layer's attention inputs (once per pair of layers, all with one key: compiled once);
    and the last layer's rest with the head (backward, the same in reverse). The MLP's gelu is
    inside (``inductor_claims.gelu_as_eager``: eager's NaN at +inf where oneDNN computes it).
    Values are renamed in the key, so equal layers give equal keys."""
    monkeypatch.setattr(inductor_ex.InductorExecutor, "fuse", lambda self, region: region.function)
    model = gpt.GPT(gpt.GPTConfig(n_layer=4), seed=0)
    idx = gpt.random_tokens(model.config, 2, 32)
    jmodel = thunder_rs.jit(model, executors=["inductor"])
    jmodel(idx, idx)[1].backward()
    keys = [region.key for region in thunder_rs.last_backward_traces(jmodel)[-1].regions()]
    assert len(keys) == 5 and len(set(keys[1:4])) == 1 and len(set(keys)) == 3
    keys = [region.key for region in thunder_rs.last_traces(jmodel)[-1].regions()]
    assert len(keys) == 5 and len(set(keys[1:4])) == 1 and len(set(keys)) == 3


@pytest.mark.slow
@pytest.mark.parametrize(
    "dtype,explicit_attention",
    [
        (torch.float32, False),
        (torch.float32, True),
        (torch.float64, False),
    ],
    ids=["float32-sdpa", "float32-masked_softmax", "float64-sdpa"],
)
def test_nanogpt_adamw_training_with_inductor_matches_eager(dtype, explicit_attention, one_thread):
    assert_nanogpt_trains_like_eager(dtype, explicit_attention, executors=["inductor"])


# -- OpInfo gradients (tests/test_ops.py's samples) through Inductor regions -----------------------


def _scaled(value):
    """``value`` with its floating tensors multiplied by 1 (exactly themselves)."""
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value * 1.0
    if isinstance(value, (list, tuple)):
        return type(value)(_scaled(v) for v in value)
    return value


def _in_a_region(op):
    """``op`` called on its inputs times 1: the partitioner leaves a single op to the torch
    executor, so alone the op would not reach Inductor; with its inputs' products it makes a
    region forward, and its gradient with theirs one backward."""

    def fn(*args, **kwargs):
        return op(*_scaled(args), **{k: _scaled(v) for k, v in kwargs.items()})

    return fn


#: The default run's cases of the sweep below; ``--run-slow`` runs every float64 sample.
DEFAULT_GRAD_CASES = ("layer_norm-sample0-float64", "cross_entropy-sample0-float64")


def pytest_generate_tests(metafunc):
    """The OpInfo gradient sweep's parameters for the run: a default run makes only its own
    cases, not 4,600 to skip."""
    if metafunc.function.__name__ == "test_op_grad_through_inductor_matches_eager":
        full = metafunc.config.getoption("--run-slow")
        params = [p for p in test_ops.grad_params(full=True) if full or p.id in DEFAULT_GRAD_CASES]
        metafunc.parametrize(("op", "index"), params)


def test_op_grad_through_inductor_matches_eager(op, index):
    sample = test_ops.sample_at(op, torch.float64, "cpu", index)
    try:
        expected = test_ops.grads(op, sample, op.op)
    except RuntimeError as e:
        pytest.skip(f"eager refuses inputs that require grad here: {e}")
    inputs = test_ops.tensors_of([sample.args, list(sample.kwargs.values())])
    if not all(t.isfinite().all() for t in inputs if t.is_floating_point()):
        pytest.skip("non-finite inputs: gradients there are conventions, not calculus")
    if not all(g.isfinite().all() for g in test_ops.tensors_of([expected])):
        pytest.skip("eager's own gradient is not finite here")
    actual = test_ops.grads(op, sample, thunder_rs.jit(_in_a_region(op.op), executors=["inductor"]))
    test_ops.assert_same(actual, expected, op.tolerance(torch.float64), sample)


@pytest.mark.inductor
def test_reset_forgets_the_compiled_regions_of_the_process():
    x = torch.randn(8, 8)

    def fn(a):
        return (a.sin() * 2 + 1).exp().tanh()

    jf = thunder_rs.jit(fn, executors=["inductor"])
    torch.testing.assert_close(jf(x), fn(x))
    assert inductor_ex._compiled
    thunder_rs.reset()
    assert not inductor_ex._compiled
    torch.testing.assert_close(jf(x), fn(x))
    assert inductor_ex._compiled and thunder_rs.cache_misses(jf) == 2


@pytest.mark.inductor
@pytest.mark.parametrize("dims", [2, 3])
def test_avg_pool_gradient_with_overhanging_ceil_mode_windows_equals_eager(dims, one_thread):
    """Inductor's avg_pool backward divides windows that ceil_mode lets overhang by the whole
    kernel (pytorch/pytorch#198119); that backward stays with the torch executor."""
    pool = torch.nn.functional.avg_pool2d if dims == 2 else torch.nn.functional.avg_pool3d

    def fn(x):
        return pool(x * 2.0, 3, 2, 0, True).exp()

    x = torch.randn(2, 3, *(9, 8, 7)[:dims], dtype=torch.float64, requires_grad=True)
    xe = x.detach().clone().requires_grad_()
    out, ref = thunder_rs.jit(fn, executors=["inductor"])(x), fn(xe)
    cotangent = torch.randn_like(ref)
    out.backward(cotangent)
    ref.backward(cotangent)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(x.grad, xe.grad)


@pytest.mark.inductor
@pytest.mark.parametrize("mode", ["nearest", "bilinear"])
def test_upsample_gradient_with_a_scale_factor_that_is_not_the_sizes_ratio_equals_eager(mode, one_thread):
    """Inductor's upsample backward maps indices by the sizes' ratio, eager by the scale factor."""

    def fn(x):
        return torch.nn.functional.interpolate(x * 2.0, scale_factor=1.7, mode=mode).exp()

    x = torch.randn(2, 3, 7, 5, dtype=torch.float64, requires_grad=True)
    xe = x.detach().clone().requires_grad_()
    out, ref = thunder_rs.jit(fn, executors=["inductor"])(x), fn(xe)
    cotangent = torch.randn_like(ref)
    out.backward(cotangent)
    ref.backward(cotangent)
    torch.testing.assert_close(x.grad, xe.grad)


@pytest.mark.inductor
def test_convolution_gradient_of_an_empty_batch_equals_eager(one_thread):
    def fn(x, w, b):
        return torch.nn.functional.conv2d(x * 2.0, w * 1.0, b).sin()

    args = [
        torch.randn(0, 3, 5, 5, dtype=torch.float64),
        torch.randn(4, 3, 3, 3, dtype=torch.float64),
        torch.randn(4, dtype=torch.float64),
    ]
    args = [a.requires_grad_() for a in args]
    expected = torch.autograd.grad(fn(*args).sum(), args)
    actual = torch.autograd.grad(thunder_rs.jit(fn, executors=["inductor"])(*args).sum(), args)
    torch.testing.assert_close(actual, expected)


def _masked_view_sum(x, w):
    t = x.shape[1]
    mask = torch.ones(t, t, device=x.device).tril()
    y = (x.exp() * 2).view(x.shape[0], t, 2, -1).sum(2) + mask[:t, :4]
    return (y.softmax(-1) @ w).sum()


def test_a_region_with_symbolic_sizes_compiles_once_for_every_length(device="cpu"):
    """The symbolic compile's regions compile with their sizes symbolic: one Inductor compile
    (per region) serves every later length where its guards hold, outputs and gradients equal to
    eager; a region that reads a size in its parameters (a view to ``(B, T, 2, -1)``, a ``T x T``
    mask, a backward's broadcast) takes the size as an input."""
    fn = _masked_view_sum
    jf = thunder_rs.jit(fn, executors=["inductor"])
    w = torch.randn(4, 4, device=device, requires_grad=True)
    before = inductor_ex.stats()
    for n in [4, 6, 9, 12, 5, 16]:
        x = torch.randn(3, n, 8, device=device, requires_grad=True)
        actual, expected = jf(x, w), fn(x, w)
        torch.testing.assert_close(actual, expected)
        for a, e in zip(torch.autograd.grad(actual, (x, w)), torch.autograd.grad(expected, (x, w))):
            torch.testing.assert_close(a, e)
    assert thunder_rs.compile_stats(jf).cache_misses == 2
    assert thunder_rs.last_traces(jf)[-1].regions()
    after = inductor_ex.stats()
    # the static compile's forward and backward regions, then the symbolic ones: four compiles
    # for six lengths, the other lengths served by the symbolic compiles
    assert (after.misses - before.misses, after.failures - before.failures) == (4, 0)
    assert after.symbolic_reuses - before.symbolic_reuses == 8
    assert jf._dynamic_off is None


@pytest.mark.gpu
@pytest.mark.slow
def test_on_cuda_a_region_with_symbolic_sizes_compiles_once_for_every_length():
    """The same with Triton kernels: Inductor's dynamic-shape CUDA code for the symbolic regions."""
    test_a_region_with_symbolic_sizes_compiles_once_for_every_length(device="cuda")


def test_a_symbolic_artifact_serves_only_sizes_its_guards_hold_for():
    """What tracing and Inductor assumed of the symbolic sizes (equal sizes, a size input among
    them, sharing a symbol; 0 and 1 kept apart; ranges) is checked before an artifact serves a
    call; a float is an input of the graph (``inductor_floats``): any value serves."""
    from torch._inductor.decomposition import select_decomp_table

    from thunder_rs.executors.inductor_ex import _inductor
    from thunder_rs.executors.inductor_symbolic import compile_symbolic

    def region(x, y, n, scale):
        return ((x + y) * scale).sum(0) * n, x.exp()

    x, y = torch.randn(4, 8), torch.randn(4, 8)
    shapes = (("T", 8), ("T", 8), "T", None)
    make_fx, compile_graph = _inductor()
    artifact = compile_symbolic(region, [x, y, 4, 2.0], shapes, make_fx, compile_graph, select_decomp_table())
    for n, m, size, scale, serves in [
        (6, 6, 6, 2.0, True),
        (9, 9, 9, 2.0, True),
        (6, 5, 6, 2.0, False),  # the sizes shared a symbol
        (6, 6, 5, 2.0, False),  # the size input shared the dim's symbol (equal sizes do)
        (1, 1, 1, 2.0, False),  # 1 is kept apart
        (6, 6, 6, 3.0, True),  # another float
    ]:
        args = [torch.randn(n, 8), torch.randn(m, 8), size, scale]
        assert artifact.serves(args) is serves, (n, m, size, scale)
        if serves:
            for a, e in zip(artifact.run(args), region(*args)):
                torch.testing.assert_close(a, e)
