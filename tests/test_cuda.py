"""thunder_rs on CUDA against eager (``gpu`` marker: skipped without a CUDA device): the OpInfo table
in float32, bfloat16 and float16, forward and gradient, with the default executors (nvFuser among
them when it imports); nvFuser regions with the real ``nvfuser_direct``; the GPT block and the
demo GPT training step under ``torch.autocast("cuda", dtype=torch.bfloat16)``. The Inductor
executor on CUDA is ``test_inductor_ex.py::test_cuda_region_equals_its_eager_calls``.

The OpInfo tests take each op's first sample (``THUNDER_RS_CUDA_SAMPLES=n`` for more): every
dtype compiles its own kernels, and the GPU check runs in a short lease.
"""

import copy
import os
import sys
import warnings
from pathlib import Path

import pytest
import torch

import thunder_rs
import test_ops
from opinfos import OPINFOS
from opinfos.core import SampleInput
from torch.utils._pytree import tree_map

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from gpt import GPT, Block, GPTConfig, random_tokens  # noqa: E402

pytestmark = [pytest.mark.gpu, *test_ops.WARNING_FILTERS]

SAMPLES = int(os.environ.get("THUNDER_RS_CUDA_SAMPLES", "1"))
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
#: Eager's half-precision kernels and thunder_rs's decompositions (which nvFuser computes in
#: float32 registers) round differently; a few units in the last place of bfloat16.
HALF = dict(rtol=3e-2, atol=3e-2)


def _tolerance(op, dtype):
    return HALF if dtype in (torch.bfloat16, torch.float16) else op.tolerance(dtype)


def _params(grad: bool):
    """The sweep's parameters, made only where CUDA is: a CPU run would make thousands to skip."""
    if not torch.cuda.is_available():
        return []
    return [
        pytest.param(op, dtype, i, id=f"{op.id}-sample{i}-{test_ops.dtype_name(dtype)}")
        for op in OPINFOS
        if torch.float32 in op.dtypes and (op.supports_grad or not grad)
        for dtype in (DTYPES[:2] if grad else DTYPES)
        for i in range(min(SAMPLES, test_ops.sample_count(op, torch.float32)))
    ]


def _sample(op, dtype, index):
    try:
        return test_ops.sample_at(op, dtype, "cuda", index)
    except (RuntimeError, TypeError, StopIteration) as e:
        pytest.skip(f"no {dtype} sample on CUDA: {e}")


def _upcast(x):
    if isinstance(x, torch.Tensor) and x.is_floating_point():
        return x.detach().double().requires_grad_(x.requires_grad)
    return x


def _float64_result(op, sample, dtype, grad: bool):
    """The op (or its gradients, for the cotangents ``test_ops.grads`` draws in ``dtype``) on
    the sample computed in float64: what both half-precision results approximate."""
    sample = SampleInput(*tree_map(_upcast, sample.args), **tree_map(_upcast, dict(sample.kwargs)))
    if not grad:
        return op.op(*sample.args, **sample.kwargs)
    leaves, outputs = test_ops.differentiable_call(op, sample, op.op)
    outputs = [t for t in outputs if t.requires_grad]
    torch.manual_seed(1)
    cotangents = [torch.randn(t.shape, dtype=dtype, device=t.device).double() for t in outputs]
    return torch.autograd.grad(outputs, leaves, cotangents, allow_unused=True, materialize_grads=True)


def _assert_like_eager(op, sample, dtype, actual, expected, grad: bool = False):
    """Eager's result within the dtype's tolerance; in half precision, where an element is not,
    thunder_rs's result may be no farther from the float64 result than twice eager's distance
    from it (thunder_rs's decompositions, and nvFuser, compute in float32 where eager's kernels
    round in half precision: an addr gradient on an H200 differed from eager's by 0.057, 1 ulp
    of bfloat16 at the terms' size after cancellation)."""
    try:
        test_ops.assert_same(actual, expected, _tolerance(op, dtype), sample)
    except AssertionError:
        if dtype not in (torch.bfloat16, torch.float16):
            raise
        reference = _float64_result(op, sample, dtype, grad)
        for a, e, r in zip(*map(test_ops.tensors_of, ([actual], [expected], [reference])), strict=True):
            finite = r.isfinite()
            if not finite.any():
                continue
            ours, eagers = ((x.double() - r)[finite].abs().max().item() for x in (a, e))
            assert ours <= 2 * eagers + 1e-3, f"{ours} from float64 where eager is {eagers} from it\n{sample}"


@pytest.mark.parametrize(("op", "dtype", "index"), _params(grad=False))
def test_op_matches_eager_on_cuda(op, dtype, index):
    sample = _sample(op, dtype, index)
    try:
        expected = op.op(*sample.args, **sample.kwargs)
    except (RuntimeError, NotImplementedError) as e:
        pytest.skip(f"eager has no CUDA {dtype} kernel here: {e}")
    actual = thunder_rs.jit(op.op)(*sample.args, **sample.kwargs)
    _assert_like_eager(op, sample, dtype, actual, expected)


@pytest.mark.parametrize(("op", "dtype", "index"), _params(grad=True))
def test_op_grad_matches_eager_on_cuda(op, dtype, index):
    sample = _sample(op, dtype, index)
    expected = test_ops.eager_grads_or_skip(op, sample, op.op)
    actual = test_ops.grads(op, sample, thunder_rs.jit(op.op))
    _assert_like_eager(op, sample, dtype, actual, expected, grad=True)


# -- nvFuser with the real nvfuser_direct -------------------------------------------------------------


def _nvfuser():
    from thunder_rs.executors import nvfuser_ex  # noqa: PLC0415 (imports nvFuser: only these tests pay it)

    executor = nvfuser_ex.nvfuser_executor()
    if not executor.available:
        pytest.skip(f"nvfuser_direct does not import: {executor.unavailable}")
    return executor


@pytest.mark.parametrize("dtype", DTYPES, ids=test_ops.dtype_name)
def test_nvfuser_regions_match_eager(dtype):
    executor = _nvfuser()

    def f(x, y, w):
        h = torch.nn.functional.layer_norm(x + y, (x.shape[-1],), w)
        return torch.nn.functional.gelu(h, approximate="tanh").softmax(-1), (h * h).sum(0)

    x, y = (torch.randn(64, 256, device="cuda", dtype=dtype) for _ in range(2))
    w = torch.randn(256, device="cuda", dtype=dtype)
    jfn = thunder_rs.jit(f, executors=[executor])
    before = dict(executor.stats)  # the named executor's counters are shared by the worker's tests
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for args in ((x, y, w), (x.t().contiguous().t(), y, w)):  # two layouts: two definitions
            out, ref = jfn(*args), f(*args)
            assert out[0].dtype == ref[0].dtype and out[1].dtype == ref[1].dtype
            torch.testing.assert_close(out, ref, **(HALF if dtype != torch.float32 else {}))
    assert thunder_rs.last_traces(jfn)[-1].regions()
    fallbacks = [str(w.message) for w in caught if "nvfuser executor" in str(w.message)]
    assert executor.stats["failures"] == before["failures"], fallbacks or executor.fallbacks
    assert executor.stats["definitions"] > before["definitions"]


def test_nvfuser_is_a_default_executor_on_cuda():
    _nvfuser()
    assert "nvfuser" in [e.name for e in thunder_rs.executors.get_default_executors()]


# -- the GPT block and the demo training step under bfloat16 autocast ----------------------------------


def _autocast():
    return torch.autocast("cuda", dtype=torch.bfloat16)


def test_gpt_block_under_autocast_matches_eager():
    torch.manual_seed(0)
    config = GPTConfig(n_embd=128, n_head=4, block_size=64)
    block = Block(config).cuda()
    eager = copy.deepcopy(block)
    x = torch.randn(4, 64, config.n_embd, device="cuda", requires_grad=True)
    xe = x.detach().clone().requires_grad_()
    jblock = thunder_rs.jit(block)
    with _autocast():
        out, ref = jblock(x), eager(xe)
    assert out.dtype == ref.dtype
    torch.testing.assert_close(out, ref, **HALF)
    g = torch.randn_like(ref)
    out.backward(g)
    ref.backward(g)
    torch.testing.assert_close(x.grad, xe.grad, **HALF)
    for (name, p), pe in zip(block.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, pe.grad, rtol=5e-2, atol=5e-2, msg=lambda m: f"grad of {name}: {m}")


def test_gpt_training_steps_under_autocast_match_eager():
    config = GPTConfig()
    model = GPT(config, seed=0).cuda()
    eager = copy.deepcopy(model)
    jmodel = thunder_rs.jit(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    opt_e = torch.optim.AdamW(eager.parameters(), lr=1e-3)
    for step in range(5):
        idx = random_tokens(config, 4, config.block_size, seed=step).cuda()
        targets = random_tokens(config, 4, config.block_size, seed=100 + step).cuda()
        with _autocast():
            loss, loss_e = jmodel(idx, targets)[1], eager(idx, targets)[1]
        torch.testing.assert_close(loss, loss_e, **HALF)
        loss.backward()
        loss_e.backward()
        for (name, p), pe in zip(model.named_parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad, pe.grad, rtol=5e-2, atol=5e-2, msg=lambda m: f"grad of {name}: {m}")
        opt.step(), opt_e.step(), opt.zero_grad(), opt_e.zero_grad()
    stats = thunder_rs.compile_stats(jmodel)
    assert stats.cache_misses == 1, stats.miss_reasons


# -- attention: the fused kernels torch chooses, forward and backward ----------------------------------

_FUSED_OPS = "aten::_scaled_dot_product_"


def _fused_attention_ops(step) -> set:
    """The fused attention aten ops (forward and backward) one call of ``step`` runs."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        step()
    return {e.key for e in prof.key_averages() if e.key.startswith(_FUSED_OPS)}


@pytest.mark.parametrize("executors", [None, ["torch"]], ids=["default", "torch"])
def test_gpt_block_bf16_training_runs_torchs_attention_kernels(executors):
    """The benchmark's block in bfloat16: the backward holds no [B, H, T, T] matrix, runs the
    fused kernels eager runs (as the profiler sees them), and the gradients are eager's."""
    import re  # noqa: PLC0415 (only this test reads traces)

    torch.manual_seed(0)
    config = GPTConfig(n_embd=768, n_head=12, block_size=1024)
    block = Block(config).cuda().to(torch.bfloat16)
    eager = copy.deepcopy(block)
    x = torch.randn(2, 1024, 768, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    xe = x.detach().clone().requires_grad_()
    g = torch.randn_like(x)
    jblock = thunder_rs.jit(block, executors=executors)
    jblock(x).backward(g)  # compiles
    x.grad = None
    for p in block.parameters():
        p.grad = None
    ran = _fused_attention_ops(lambda: jblock(x).backward(g))
    expected = _fused_attention_ops(lambda: eager(xe).backward(g))
    assert ran == expected and ran, (ran, expected)
    backward = str(thunder_rs.last_backward_traces(jblock)[-1])
    assert not re.search(r"\[2, 12, 1024, 1024\]", backward), backward
    torch.testing.assert_close(x.grad, xe.grad, **HALF)
    for (name, p), pe in zip(block.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, pe.grad, rtol=5e-2, atol=5e-2, msg=lambda m: f"grad of {name}: {m}")


def _attention_inputs(case: str, dtype):
    """query, key and value (heads after positions, as split from one projection), and the
    keywords of the case."""
    torch.manual_seed(0)

    def heads_after_positions(positions, heads):
        return torch.randn(2, positions, heads, 64, device="cuda", dtype=dtype).transpose(1, 2).requires_grad_()

    keys = 48 if case == "causal" else 40  # causal flash needs as many keys as queries
    q = heads_after_positions(48, 4)
    k, v = (heads_after_positions(keys, 2 if case == "gqa" else 4) for _ in range(2))
    if case == "bool_mask":  # row 3 sees no key: the backends' conventions for it show
        mask = torch.rand(48, keys, device="cuda") > 0.3
        mask[3] = False
        return (q, k, v), dict(attn_mask=mask)
    if case == "float_mask":
        return (q, k, v), dict(attn_mask=torch.randn(1, 4, 48, keys, device="cuda", dtype=dtype, requires_grad=True))
    return (q, k, v), {"causal": dict(is_causal=True), "gqa": dict(enable_gqa=True), "dropout": dict(dropout_p=0.25)}[
        case
    ]


@pytest.mark.parametrize("case", ["causal", "gqa", "dropout", "bool_mask", "float_mask"])
@pytest.mark.parametrize("backend", ["FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION"])
def test_attention_under_each_backend_is_eagers(backend, case):
    """Under ``sdpa_kernel(backend)``: the same fused ops as eager, the same output and gradients
    (dropout included: the kernels draw from the generator as eager's do; a row the bool mask
    hides entirely included: it checks ``fused_attention.CUDNN_MASK_FILL``)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: PLC0415

    (q, k, v), kwargs = _attention_inputs(case, torch.bfloat16)
    leaves = [t for t in (q, k, v, kwargs.get("attn_mask")) if t is not None and t.requires_grad]

    def run(fn):
        torch.manual_seed(1)
        out = fn(q, k, v)
        return (out, *torch.autograd.grad(out, leaves, torch.ones_like(out)))

    def sdpa(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, **kwargs)

    with sdpa_kernel(getattr(SDPBackend, backend)):
        try:
            expected_ops = _fused_attention_ops(lambda: run(sdpa))
            expected = run(sdpa)
        except RuntimeError as e:
            pytest.skip(f"eager has no {backend} kernel for this call here: {e}")
        jfn = thunder_rs.jit(sdpa)
        actual = run(jfn)
        assert _fused_attention_ops(lambda: run(jfn)) == expected_ops
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, equal_nan=True, **HALF)


@pytest.mark.parametrize("starts", [(0, 1, 8), (1, 0, 3)], ids=["aligned_first", "misaligned_first"])
def test_attention_over_slices_at_odd_storage_offsets_runs_eagers_kernels(starts):
    """q, k and v sliced from a packed buffer at an offset the memory-efficient kernel refuses (its
    storage must start on 16 bytes): each call runs the fused ops eager runs for its offset, with
    eager's output and gradients; a call at another offset on the same side of the boundary hits
    the entry compiled for that side (``fused_attention.guard_offsets``; on the CPU:
    test_attention_kernels.py's offset tests)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: PLC0415

    torch.manual_seed(0)
    buffer = torch.randn(2, 16, 3 * 256 + 8, device="cuda", dtype=torch.bfloat16)

    def sliced(start):
        qkv = buffer[..., start : start + 3 * 256].unflatten(-1, (3, 4, 64))
        return [qkv[:, :, i].transpose(1, 2).detach().requires_grad_() for i in range(3)]

    def sdpa(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)

    def run(fn, inputs):
        out = fn(*inputs)
        return (out, *torch.autograd.grad(out, inputs, torch.ones_like(out)))

    jfn = thunder_rs.jit(sdpa)
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
        for start in starts:
            inputs = sliced(start)
            expected_ops = _fused_attention_ops(lambda: run(sdpa, inputs))
            actual, expected = run(jfn, inputs), run(sdpa, inputs)
            assert _fused_attention_ops(lambda: run(jfn, inputs)) == expected_ops, start
            for a, e in zip(actual, expected):
                torch.testing.assert_close(a, e, **HALF)
    assert thunder_rs.compile_stats(jfn).cache_misses == 2, thunder_rs.compile_stats(jfn).miss_reasons


#: (id, dtype, head size, mask, dropout_p, enable_gqa, query start) of calls whose kernel torch's
#: default choice decides (no sdpa_kernel): the fused kernels' dtypes, head sizes (a multiple of 8
#: or not, past cuDNN's backward sizes on sm90, past every fused kernel's), masks (flash takes
#: none), dropout, grouped heads, and a query off the memory-efficient kernel's 16-byte boundary.
DEFAULT_CHOICE_CASES = [
    ("bf16", torch.bfloat16, 64, None, 0.0, False, 0),
    ("bf16_bool_mask", torch.bfloat16, 64, "bool", 0.0, False, 0),
    ("bf16_float_mask_grad", torch.bfloat16, 64, "float_grad", 0.0, False, 0),
    ("fp16_dropout", torch.float16, 128, None, 0.25, False, 0),
    ("bf16_gqa", torch.bfloat16, 128, None, 0.0, True, 0),
    ("bf16_head_80_float_mask", torch.bfloat16, 80, "float", 0.0, False, 0),
    ("bf16_head_160", torch.bfloat16, 160, None, 0.0, False, 0),
    ("bf16_head_160_mask_misaligned", torch.bfloat16, 160, "float", 0.0, False, 4),
    ("fp16_head_36", torch.float16, 36, None, 0.0, False, 0),
    ("fp32", torch.float32, 64, None, 0.0, False, 0),
    ("fp32_bool_mask_dropout", torch.float32, 64, "bool", 0.125, False, 0),
    ("fp64_math", torch.float64, 64, None, 0.0, False, 0),
    ("bf16_head_384_math", torch.bfloat16, 384, None, 0.0, False, 0),
]


def _default_choice_inputs(dtype, size, mask, dropout_p, gqa, start):
    torch.manual_seed(0)
    heads = (8, 2) if gqa else (4, 4)
    buffer = torch.randn(2 * heads[0] * 32 * size + start, device="cuda", dtype=dtype)
    q = buffer[start:].view(2, heads[0], 32, size).detach().requires_grad_()
    k, v = (torch.randn(2, heads[1], 40, size, device="cuda", dtype=dtype, requires_grad=True) for _ in range(2))
    kwargs = dict(dropout_p=dropout_p, enable_gqa=gqa)
    if mask == "bool":
        kwargs["attn_mask"] = torch.rand(32, 40, device="cuda") > 0.2
    elif mask is not None:
        kwargs["attn_mask"] = torch.randn(1, heads[0], 32, 40, device="cuda", dtype=dtype)
        kwargs["attn_mask"].requires_grad_(mask == "float_grad")
    return (q, k, v), kwargs


@pytest.mark.parametrize("grad", [True, False], ids=["training", "inference"])
@pytest.mark.parametrize("case", DEFAULT_CHOICE_CASES, ids=[c[0] for c in DEFAULT_CHOICE_CASES])
def test_attention_runs_the_kernels_of_torchs_default_choice(case, grad):
    """Without sdpa_kernel: the fused ops eager runs (none where torch takes its math path), forward
    and backward, and eager's output and gradients. A differentiated call torch sends to its math
    path records that path op by op (the forward, which runs without grad, would pick again:
    ``bf16_head_160_mask_misaligned`` on sm90 with cuDNN > 9.22, whose backward head sizes torch
    asks of inputs that require grad only, is such a call)."""
    _, dtype, size, mask, dropout_p, gqa, start = case
    (q, k, v), kwargs = _default_choice_inputs(dtype, size, mask, dropout_p, gqa, start)
    leaves = [t for t in (q, k, v, kwargs.get("attn_mask")) if t is not None and t.requires_grad]

    def sdpa(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, **kwargs)

    def run(fn):
        torch.manual_seed(1)
        if not grad:
            with torch.no_grad():
                return (fn(q, k, v),)
        out = fn(q, k, v)
        return (out, *torch.autograd.grad(out, leaves, torch.ones_like(out)))

    def fused(step) -> set:  # (the math path's values are compared below, whatever runs them)
        return {op for op in _fused_attention_ops(step) if not op.endswith("_attention_math")}

    expected_ops, expected = fused(lambda: run(sdpa)), run(sdpa)
    jfn = thunder_rs.jit(sdpa)
    actual = run(jfn)
    assert fused(lambda: run(jfn)) == expected_ops
    tolerance = HALF if dtype in (torch.bfloat16, torch.float16) else {}
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(a, e, equal_nan=True, **tolerance)


# -- shapes that change between calls ------------------------------------------------------------------


def test_gpt_trains_with_changing_lengths_under_autocast():
    """The demo GPT trained at a new length each step on CUDA (torch's attention kernels, nvFuser
    among the executors): every loss and gradient is eager's, and the lengths share few compiles."""
    config = GPTConfig()
    model = GPT(config, seed=0).cuda()
    eager = copy.deepcopy(model)
    jmodel = thunder_rs.jit(model)
    for step, n in enumerate([16, 24, 20, 32, 12, 27]):
        idx = random_tokens(config, 4, n, seed=step).cuda()
        targets = random_tokens(config, 4, n, seed=100 + step).cuda()
        with _autocast():
            loss, loss_e = jmodel(idx, targets)[1], eager(idx, targets)[1]
        torch.testing.assert_close(loss, loss_e, **HALF)
        got = torch.autograd.grad(loss, list(model.parameters()))
        want = torch.autograd.grad(loss_e, list(eager.parameters()))
        for (name, _), g, e in zip(model.named_parameters(), got, want):
            torch.testing.assert_close(g, e, rtol=5e-2, atol=5e-2, msg=lambda m: f"grad of {name}: {m}")
    stats = thunder_rs.compile_stats(jmodel)
    assert stats.cache_misses <= 3, stats.miss_reasons


def test_hf_gpt2_sdpa_with_padding_lengths_on_cuda():
    """HF GPT-2 with torch's attention (sdpa) and padding masks at several lengths, float32 on
    CUDA: outputs and gradients equal eager's, in few compiles."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2,
        n_head=2,
        n_embd=64,
        vocab_size=100,
        n_positions=128,
        attn_implementation="sdpa",
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    model = transformers.GPT2LMHeadModel(config).cuda()
    jm = thunder_rs.jit(model)
    for n in [16, 24, 40, 17, 33]:
        ids = torch.randint(0, 100, (2, n), device="cuda")
        mask = (torch.arange(n, device="cuda")[None, :] < torch.tensor([[n], [n - 3]], device="cuda")).long()
        labels = ids.masked_fill(mask == 0, -100)
        out = jm(input_ids=ids, attention_mask=mask, labels=labels)
        ref = model(input_ids=ids, attention_mask=mask, labels=labels)
        torch.testing.assert_close(out.logits, ref.logits, rtol=1e-4, atol=1e-4)
        got = torch.autograd.grad(out.loss, list(model.parameters()))
        want = torch.autograd.grad(ref.loss, list(model.parameters()))
        for g, e in zip(got, want):
            torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4)
    stats = thunder_rs.compile_stats(jm)
    assert stats.cache_misses <= 3, stats.miss_reasons
