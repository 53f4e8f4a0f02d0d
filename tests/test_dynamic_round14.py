"""Shapes that change between calls (issue 26), a fourteenth sweep, on what GPU users run: HF GPT-2
and Llama training steps (float32 and under bfloat16 autocast) over sequence lengths and batch sizes,
a KV-cache decode whose cache grows each token, through the CUDA default executors (the stand-in
``nvfuser_direct``, then torch, with torch's fused attention kernel) on fake CUDA tensors
(``FakeTensorMode``: no values, every kernel's meta computation, as ``test_cuda_training``). Each
call's outputs and each gradient have eager's dtype, shape, strides and device; the compiles and the
nvFuser definitions are counted, and each definition's inputs are checked: extent -1 exactly at the
region's symbolic dims, the contiguity and stride order nvFuser computes for the tensors it is given.

What the sweep found, each fixed and pinned here: a region with symbolic dims computed its key, on
every call, with ``compute_tensor_descriptor`` of each tensor input (a call into the bindings per
tensor; 11x the static regions' key with the stand-in's): it is computed once per concrete layout
and looked up after (``nvfuser_symbolic.symbolic_layouts``; ``benchmarks/nvfuser_region_keys.py``).
The stand-in refused a reshape with a constant -1 among its sizes on a symbolic input or with scalar
sizes ("negative dimension"), where nvFuser's ``reshape`` (csrc/ops/alias.cpp) takes one (the
input's numel over the other sizes), and refused the rest with torch's messages, a scalar that is -1
when executing not at all; it accepts and refuses as nvFuser does now.

Checked and equal to eager, nothing to fix: GPT-2 and Llama training steps over six lengths and four
batch sizes, float32 and under bfloat16 autocast: three compiles (the first shapes, the symbolic
length, the symbolic batch), each region defined once per compile, none after the third compile,
the backward's attention torch's fused kernel (cuDNN's under autocast, the memory-efficient one in
float32) at the symbolic sizes; the same through an ALiBi bias of each length handed to the fused
kernel as its mask; a 64-token decode with a growing cache: two compiles (the cache's length is
symbolic from its second value on: 0 is kept constant), no definition after the second step;
``jit(dynamic=True)`` compiles symbolically from the first call (three compiles: as torch's duck
sizing, the first cache length, equal to the heads, shares their symbol), ``jit(dynamic=False)``
once per length; the miss reasons name the symbolic dims. The stand-in binds symbolic extents,
layouts and ranks as nvFuser does (a size-1 extent at -1, contiguity false, expanded broadcasts).
Left: the stand-in's lenient retry while defining a definition with symbolic inputs logs torch's
broadcast errors through ``FakeTensorMode``'s logger (noise), and defers a static op's refusal
there to ``execute``; under bfloat16 autocast five Llama regions per compile, static or symbolic,
run on row-major copies of their inputs (``dense_copies``: the stand-in refused their layouts as
nvFuser's schedulers did on the H100).
"""

import contextlib
import math
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

import thunder_rs
from thunder_rs._core import SymExpr

import fake_nvfuser_direct as fake
from test_cuda_training import _backward_checked, _cuda_autocast, _made_in, _metadata, cuda_ex  # noqa: F401

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.filterwarnings("ignore:thunder_rs.*recompiled")]


# -- what the nvFuser executor defined and executed --------------------------------------------------


@pytest.fixture
def seen(cuda_ex, monkeypatch):  # noqa: F811 (the fixture imported above)
    """The ``NvFuserRegion``s the executor makes and, per stand-in ``execute``, the definition and
    its tensor inputs' sizes and strides."""
    regions, executed = [], []
    fuse = cuda_ex.fuse
    monkeypatch.setattr(cuda_ex, "fuse", lambda region: regions.append(fuse(region)) or regions[-1])
    execute = fake.FusionDefinition.execute

    def recorded(fd, inputs, **kwargs):
        executed.append((fd, [(list(a.shape), list(a.stride())) if isinstance(a, torch.Tensor) else a for a in inputs]))
        return execute(fd, inputs, **kwargs)

    monkeypatch.setattr(fake.FusionDefinition, "execute", recorded)
    return regions, executed


def _assert_definitions_as_nvfuser_takes_them(regions, executed) -> None:
    """Each region has one definition per layout, a symbolic one a single one; its tensor inputs have
    extent -1 exactly at the region's symbolic dims, and every execute's tensors have the contiguity
    and stride order nvFuser computes for them (``compute_tensor_descriptor``)."""
    assert any(any(isinstance(s, SymExpr) for s in _dims(shape)) for r in regions for shape in r.region.input_shapes)
    for r in regions:
        symbolic = [[isinstance(s, SymExpr) for s in _dims(shape)] for shape in r.region.input_shapes]
        if any(map(any, symbolic)):
            assert len(r.definitions) == 1, r.region.name
        for run in r.definitions.values():
            fd = getattr(run, "fd", None)
            for (tv, spec), flags in zip(fd._inputs if fd is not None else (), symbolic):
                if isinstance(spec, tuple | list):
                    assert [s == -1 for s in spec[0]] == flags, (r.region.name, spec[0], r.region.input_shapes)
    for fd, inputs in executed:
        for (tv, spec), arg in zip(fd._inputs, inputs):
            if isinstance(spec, tuple | list):
                shape, contiguity, _, order = spec
                sizes, strides = arg
                assert [s if s == -1 else n for s, n in zip(shape, sizes)] == shape
                wanted, wanted_order = fake.compute_tensor_descriptor(sizes, strides)
                assert (contiguity, order) == (list(wanted), list(wanted_order)), (sizes, strides)


def _dims(shape) -> tuple:
    return shape if isinstance(shape, tuple) else ()


def _misses(jfn) -> int:
    return thunder_rs.compile_stats(jfn).cache_misses


# -- training steps over sequence lengths and batch sizes ---------------------------------------------

#: (batch, length): six lengths at batch 2, then four more batch sizes at other lengths
SHAPES = ((2, 8), (2, 12), (2, 16), (2, 5), (2, 30), (2, 9), (3, 8), (4, 11), (5, 7), (6, 20))


def _hf_on_fake_cuda(name: str):
    pytest.importorskip("transformers")
    from test_hf_models import tiny_model  # noqa: PLC0415 (imports transformers)

    with pytest.MonkeyPatch.context() as m, torch.device("cuda"):
        m.setattr(torch.nn.Module, "to", lambda self, *args, **kwargs: self)
        return tiny_model(name)


def _train_over_shapes(name, autocast, shapes, cuda_ex, seen, monkeypatch):  # noqa: F811
    regions, executed = seen
    definitions = []
    with FakeTensorMode():
        model = _hf_on_fake_cuda(name)
        jmodel = thunder_rs.jit(model, executors=[cuda_ex, "torch"])
        for batch, length in shapes:
            ids = torch.randint(3, 99, (batch, length), device="cuda")
            with _cuda_autocast(monkeypatch, torch.bfloat16) if autocast else contextlib.nullcontext():
                out, expected = jmodel(input_ids=ids, labels=ids), model(input_ids=ids, labels=ids)
            for actual, wanted in ((out.loss, expected.loss), (out.logits, expected.logits)):
                assert _metadata(actual) == _metadata(wanted), (batch, length)
            _backward_checked(out.loss)
            definitions.append((_misses(jmodel), cuda_ex.stats["definitions"]))
    assert cuda_ex.stats["failures"] == 0, cuda_ex.fallbacks
    _assert_definitions_as_nvfuser_takes_them(regions, executed)
    backward = str(thunder_rs.last_backward_traces(jmodel)[-1])
    assert f"torch_{'cudnn' if autocast else 'efficient'}_attention_backward(" in backward
    return jmodel, definitions


@pytest.mark.parametrize(
    ("name", "autocast"),
    [
        pytest.param(name, autocast, id=f"{name}-{'bf16_autocast' if autocast else 'float32'}", marks=pytest.mark.slow)
        for name in ("gpt2", "llama")
        for autocast in (False, True)
    ],
)
def test_a_training_step_over_lengths_and_batches_defines_each_region_once(name, autocast, cuda_ex, seen, monkeypatch):  # noqa: F811
    """Six lengths, then four batch sizes: three compiles (the first shapes, the symbolic length, the
    symbolic batch and length), no definition after the third, each symbolic region defined once."""
    jmodel, definitions = _train_over_shapes(name, autocast, SHAPES, cuda_ex, seen, monkeypatch)
    assert _misses(jmodel) == 3, thunder_rs.compile_stats(jmodel).miss_reasons
    third = [defined for misses, defined in definitions if misses == 3]
    assert len(set(third)) == 1 and len(third) == 4, definitions
    reasons = thunder_rs.compile_stats(jmodel).miss_reasons
    assert "compiled with symbolic sizes input_ids.shape[1]" in reasons[1]
    assert "compiled with symbolic sizes input_ids.shape[0], input_ids.shape[1]" in reasons[2]


def test_a_bf16_autocast_llama_step_over_lengths_and_a_batch_is_defined_once_per_compile(cuda_ex, seen, monkeypatch):  # noqa: F811
    """The default run's case of the above: two lengths, then a batch size (the decode below checks
    that a compiled length defines nothing more)."""
    shapes = ((2, 8), (2, 12), (3, 9))
    jmodel, definitions = _train_over_shapes("llama", True, shapes, cuda_ex, seen, monkeypatch)
    assert _misses(jmodel) == 3, thunder_rs.compile_stats(jmodel).miss_reasons
    assert definitions[2][1] == 3 * definitions[0][1]  # (each compile's regions defined once)


# -- a KV-cache decode whose cache grows each token ------------------------------------------------------


class AlibiDecoder(nn.Module):
    """A decoder layer over a cache that ``torch.cat`` grows by the step's tokens (HF's dynamic cache),
    attention by ``scaled_dot_product_attention`` with an ALiBi bias over the cache's length (BLOOM's,
    MPT's) built from ``arange``: an nvFuser region of the symbolic length feeding the fused kernel."""

    def __init__(self, dim: int = 32, heads: int = 4, vocab: int = 50):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.embed, self.norm = nn.Embedding(vocab, dim), nn.LayerNorm(dim)
        self.qkv, self.out, self.head = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim), nn.Linear(dim, vocab)
        self.register_buffer("slopes", 2.0 ** -torch.arange(1, heads + 1.0).view(heads, 1, 1), persistent=False)

    def forward(self, tokens, k_cache, v_cache):
        b, t = tokens.shape
        x = self.embed(tokens)
        qkv = self.qkv(self.norm(x)).split(x.shape[-1], -1)
        q, k, v = (u.view(b, t, self.heads, self.head_dim).transpose(1, 2) for u in qkv)
        k_cache, v_cache = torch.cat([k_cache, k], 2), torch.cat([v_cache, v], 2)
        n = k_cache.shape[2]
        keys, queries = torch.arange(n, device=x.device), torch.arange(n - t, n, device=x.device)
        bias = -(queries[:, None] - keys[None, :]).clamp(min=0).to(x.dtype) * self.slopes.to(x.dtype)
        bias = bias.masked_fill(keys[None, :] > queries[:, None], float("-inf"))
        a = F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=bias / math.sqrt(self.head_dim))
        y = x + self.out(a.transpose(1, 2).reshape(b, t, -1))
        return self.head(self.norm(y))[:, -1], k_cache, v_cache


def _decode(model, steps: int, dtype, **jit_options):
    """A prompt of 4 tokens, then ``steps - 1`` greedy ones, jitted and eager side by side: each
    step's logits and caches of eager's metadata. The jitted module and the definitions per step."""
    jmodel = thunder_rs.jit(model, **jit_options)
    tokens = torch.randint(0, 50, (2, 4), device="cuda")
    caches = [[torch.zeros(2, 4, 0, 8, device="cuda", dtype=dtype) for _ in range(2)] for _ in range(2)]
    executor = jit_options["executors"][0]
    definitions = []
    with torch.no_grad():
        for _ in range(steps):
            (logits, *caches[0]), (expected, *caches[1]) = jmodel(tokens, *caches[0]), model(tokens, *caches[1])
            for actual, wanted in ((logits, expected), *zip(caches[0], caches[1])):
                assert _metadata(actual) == _metadata(wanted)
            tokens = logits.argmax(-1, keepdim=True)
            definitions.append(executor.stats["definitions"])
    assert executor.stats["failures"] == 0, executor.fallbacks
    return jmodel, definitions


@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.slow)])
def test_a_64_token_decode_with_a_growing_cache_compiles_twice(dtype, cuda_ex, seen):  # noqa: F811
    """The prompt (an empty cache: 0 is kept constant), then the cache's length symbolic from the
    first token on (it was 0, then 4): two compiles for 64 tokens (the issue's target: at most 3), no
    definition after the second step, the bias region's definition symbolic."""
    regions, executed = seen
    with FakeTensorMode():
        with _made_in(dtype):
            model = AlibiDecoder().eval()
        jmodel, definitions = _decode(model, 64, dtype, executors=[cuda_ex, "torch"])
    assert _misses(jmodel) == 2, thunder_rs.compile_stats(jmodel).miss_reasons
    assert len(set(definitions[1:])) == 1, definitions
    assert "compiled with symbolic sizes k_cache.shape[2]" in thunder_rs.compile_stats(jmodel).miss_reasons[1]
    _assert_definitions_as_nvfuser_takes_them(regions, executed)
    # (no grad: torch's sdpa picks the fused kernel itself, on the bias the cache's region makes)
    assert "torch_scaled_dot_product_attention(" in str(thunder_rs.last_traces(jmodel)[-1])


@pytest.mark.slow
@pytest.mark.parametrize("autocast", [False, True], ids=["float32", "bf16_autocast"])
def test_training_through_the_fused_kernel_with_a_bias_of_each_length(autocast, cuda_ex, seen, monkeypatch):  # noqa: F811
    """The decoder's prompt step trained at three lengths, then two batch sizes: the bias region
    symbolic, torch's fused kernel (memory-efficient in float32, cuDNN's under bfloat16 autocast)
    forward and backward at the symbolic sizes, three compiles, each region defined once per compile."""
    regions, executed = seen
    with FakeTensorMode():
        with torch.device("cuda"):
            model = AlibiDecoder()
        jmodel = thunder_rs.jit(model, executors=[cuda_ex, "torch"])
        for batch, length in ((2, 6), (2, 9), (2, 13), (3, 7), (4, 21)):
            tokens = torch.randint(0, 50, (batch, length), device="cuda")
            caches = [torch.zeros(batch, 4, 0, 8, device="cuda") for _ in range(2)]
            with _cuda_autocast(monkeypatch, torch.bfloat16) if autocast else contextlib.nullcontext():
                out, expected = jmodel(tokens, *caches), model(tokens, *caches)
            assert [_metadata(t) for t in out] == [_metadata(t) for t in expected]
            _backward_checked(out[0])
    assert _misses(jmodel) == 3, thunder_rs.compile_stats(jmodel).miss_reasons
    assert cuda_ex.stats["failures"] == 0, cuda_ex.fallbacks
    _assert_definitions_as_nvfuser_takes_them(regions, executed)
    kernel = "cudnn" if autocast else "efficient"
    assert f"torch_{kernel}_attention_backward(" in str(thunder_rs.last_backward_traces(jmodel)[-1])


def test_jits_dynamic_option_marks_the_cache_length_up_front_or_turns_it_off(cuda_ex):  # noqa: F811
    """``dynamic=True``: the prompt's compile is symbolic already; sizes of one value share a symbol
    (torch's duck sizing), so the first cache length, 4 as the heads, is one with them, and the
    next length compiles once more: three compiles, then none. ``dynamic=False``: one per length."""
    with FakeTensorMode():
        with torch.device("cuda"):
            model = AlibiDecoder().eval()
        marked, definitions = _decode(model, 6, torch.float32, executors=[cuda_ex, "torch"], dynamic=True)
        reasons = thunder_rs.compile_stats(marked).miss_reasons
        assert _misses(marked) == 3, reasons
        assert reasons[0].startswith("first call; compiled with symbolic sizes tokens.shape[0], tokens.shape[1]")
        assert "k_cache.shape[2] == t1 fails" in reasons[2]
        assert len(set(definitions[2:])) == 1, definitions
        static, _ = _decode(model, 6, torch.float32, executors=[cuda_ex, "torch"], dynamic=False)
    assert _misses(static) == 6, thunder_rs.compile_stats(static).miss_reasons
    assert "symbolic" not in " ".join(thunder_rs.compile_stats(static).miss_reasons)


# -- the per-call key of a symbolic region ------------------------------------------------------------


def _norm_and_scale(x, w):
    return F.layer_norm(x, x.shape[-1:]) * w + x.sum(-1, keepdim=True)


def test_a_symbolic_regions_key_reads_no_descriptor_once_its_layouts_are_known(fake_ex, monkeypatch):
    """Each call of a region with symbolic dims computed ``compute_tensor_descriptor`` of each tensor
    input for its key (11x a static region's key on the stand-in; a call into the bindings per
    tensor on nvFuser): at lengths seen before, a call computes none now, and its outputs and
    gradients are eager's."""
    calls = []
    descriptor = fake.compute_tensor_descriptor
    monkeypatch.setattr(fake, "compute_tensor_descriptor", lambda *args: calls.append(args) or descriptor(*args))
    jfn = thunder_rs.jit(_norm_and_scale, executors=[fake_ex, "torch"])
    w = torch.randn(8, requires_grad=True)
    seen = []
    for _ in range(2):
        seen.append(len(calls))
        for n in (3, 5, 7, 9):
            x = torch.randn(2, n, 8, requires_grad=True)
            expected, actual = _norm_and_scale(x, w), jfn(x, w)
            torch.testing.assert_close(actual, expected)
            grads = [torch.autograd.grad(y.square().sum(), (x, w)) for y in (actual, expected)]
            torch.testing.assert_close(*grads, rtol=1e-4, atol=1e-4)
    assert _misses(jfn) == 2 and fake_ex.stats["failures"] == 0
    assert len(calls) == seen[1], calls[seen[1] :]


# -- the stand-in's reshape against nvFuser's -----------------------------------------------------------


def _reshape_definition(module, make_sizes, shape=(-1, 8)):
    """A reshape of an ``[n, 8]`` tensor (``shape``; -1 symbolic) to ``make_sizes(fd, x, k)``, k an Int
    scalar input where the shape is symbolic. (A static definition has none: the stand-in defines the
    ops of a definition with symbolic inputs leniently, and refuses a static reshape when executing.)"""
    with module.FusionDefinition() as fd:
        x = fd.define_tensor(shape=list(shape), contiguity=[True, True], dtype=module.DataType.Float)
        k = fd.define_scalar(dtype=module.DataType.Int) if -1 in shape else None
        fd.add_output(fd.ops.reshape(x, make_sizes(fd, x, k)))
    return fd


def _check_reshapes_with_inferred_sizes(module, device):
    """One constant -1 among the sizes is the input's numel over the others', symbolic input or scalar
    sizes; two are refused when defining; a count that does not match, or a scalar that is -1 when it
    executes, when executing (``reshape``, csrc/ops/alias.cpp; ``analyzeReshapes``,
    csrc/dynamic_transform.cpp; ``inferViewShapes``, csrc/transform_view.cpp)."""
    cases = {
        (lambda fd, x, k: [-1]): lambda x, k: x.reshape(-1),
        (lambda fd, x, k: [fd.ops.size(x, 0), 2, -1]): lambda x, k: x.reshape(len(x), 2, 4),
        (lambda fd, x, k: [k, -1]): lambda x, k: x.reshape(k, -1),
        (lambda fd, x, k: [-1, fd.ops.mul(k, 2)]): lambda x, k: x.reshape(-1, 2 * k),
    }
    for make_sizes, expected in cases.items():
        fd = _reshape_definition(module, make_sizes)
        for n, k in ((6, 4), (12, 2)):
            x = torch.randn(n, 8, device=device)
            (out,) = fd.execute([x, k])
            assert torch.equal(out, expected(x, k))
    for shape in ((-1, 8), (3, 8)):
        with pytest.raises(RuntimeError, match="A maximum of one value of -1|Only one dimension can by inferred"):
            _reshape_definition(module, lambda fd, x, k: [-1, -1], shape)
    x = torch.randn(3, 8, device=device)
    fd = _reshape_definition(module, lambda fd, x, k: [k, 8])
    with pytest.raises(RuntimeError, match="Total element counts across view operation must match: 24 vs 32"):
        fd.execute([x, 4])
    with pytest.raises(RuntimeError, match="Values of -1 passed to reshape must be constant at definition"):
        fd.execute([x, -1])
    with pytest.raises(RuntimeError, match="Total element counts across view operation must match: 24 vs 20"):
        _reshape_definition(module, lambda fd, x, k: [5, -1]).execute([x, 0])
    with pytest.raises(RuntimeError, match="Cannot infer the actual size of -1 output domain"):
        _reshape_definition(module, lambda fd, x, k: [5, -1], (3, 8))


def test_the_stand_in_reshapes_with_an_inferred_size_as_nvfuser_does():
    """The stand-in refused a -1 among the sizes of a symbolic reshape ("negative dimension"), and
    refused the rest with torch's messages."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _check_reshapes_with_inferred_sizes(fake, "cpu")


@pytest.mark.gpu
def test_the_real_bindings_reshape_with_an_inferred_size_so(real_nvfuser):
    _check_reshapes_with_inferred_sizes(real_nvfuser, "cuda")


def _check_symbolic_bindings(module, device):
    """What a definition of symbolic extents takes (``bindTensorDomain``, csrc/expr_evaluator.cpp;
    ``validateAllocationSizesAndStrides``): any extent at -1, 1 included, and at a size-1 dim any
    stride; the rank defined; strides contiguity implies where it is true, any where false; at a -1
    dim of contiguity None (an expanded broadcast: ``getExpanded``) size 1, or any size of stride 0."""
    with module.FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=module.DataType.Float)
        y = fd.define_tensor(shape=[-1, -1], contiguity=[False, True], dtype=module.DataType.Float)
        b = fd.define_tensor(shape=[-1, -1], contiguity=[None, True], dtype=module.DataType.Float)
        fd.add_output(fd.ops.add(fd.ops.add(x, y), b))
    wide = torch.randn(5, 16, device=device)
    for n in (1, 3, 5):
        x, y, b = torch.randn(n, 8, device=device), wide[:n, :8], torch.randn(1, 8, device=device)
        assert torch.equal(fd.execute([x, y, b])[0], x + y + b)
        assert torch.equal(fd.execute([x, y, b.expand(n, 8)])[0], x + y + b)
    row = torch.randn(8, 1, device=device).t()  # (size 1 at dim 0, stride 1 there)
    assert torch.equal(fd.execute([row, row, row])[0], row * 3)
    x = torch.randn(3, 8, device=device)
    with pytest.raises(RuntimeError, match="stride mismatch with contiguity info"):
        fd.execute([wide[:3, :8], x, x[:1]])
    with pytest.raises(RuntimeError, match="to be bound to a tensor of rank 2, but got a tensor of rank 3"):
        fd.execute([x[None], x, x[:1]])
    with pytest.raises(RuntimeError, match="has expanded extent but input tensor has size 3 and stride 8"):
        fd.execute([x, x, x])


def test_the_stand_in_binds_symbolic_extents_layouts_and_ranks_as_nvfuser_does():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _check_symbolic_bindings(fake, "cpu")


@pytest.mark.gpu
def test_the_real_bindings_bind_symbolic_extents_layouts_and_ranks_so(real_nvfuser):
    _check_symbolic_bindings(real_nvfuser, "cuda")
