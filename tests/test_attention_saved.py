"""What a differentiated ``F.scaled_dot_product_attention`` saves for backward, against eager: the
CPU flash kernel's inputs, output and logsumexp; eager's math path's probabilities (the [B, H, L, S]
matrix its autograd keeps, which the compiled backward reads instead of computing the attention
again), on the first call (the compile) and on later ones, with gradients equal to eager's."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

import thunder_rs


def _storages(packed) -> list:
    """The sizes in bytes of the distinct storages of the tensors ``packed``, sorted: the memory
    they hold (eager packs a tensor once per node that saves it, views of one storage too)."""
    seen = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in packed}
    return sorted(seen.values())


def _step(fn, inputs, backend=None):
    """Outputs, gradients of ``inputs``, what was saved (``_storages``) and the ops the backward ran."""
    packed = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t):
        with sdpa_kernel(backend) if backend is not None else torch.enable_grad():
            out = fn(*inputs)
    cot = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(1))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        grads = torch.autograd.grad(out, [x for x in inputs if x.requires_grad], cot)
    return out, grads, _storages(packed), {e.name for e in prof.events()}


#: Attention that recomputed would run one of these in the backward
_FORWARD_OPS = {"aten::_safe_softmax", "aten::_softmax", "aten::scaled_dot_product_attention"}


def _check(fn, inputs, backend=None):
    out, grads, saved, _ = _step(fn, inputs, backend)
    jfn = thunder_rs.jit(fn)
    for _ in range(2):  # (the first call, which compiles, and a later one)
        jit_out, jit_grads, jit_saved, ran = _step(jfn, inputs, backend)
        assert torch.equal(out, jit_out)
        assert all(torch.equal(x, y) for x, y in zip(grads, jit_grads, strict=True))
        assert jit_saved == saved
        assert not ran & _FORWARD_OPS, f"the backward computed the attention again: {ran & _FORWARD_OPS}"


def _leaves(*shapes, dtype=torch.float32):
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(s, dtype=dtype, generator=gen).requires_grad_() for s in shapes]


#: Calls eager's CPU dispatch sends to its math path (its flash kernel takes none of them):
#: name -> (program, input shapes, dtype)
MATH_CALLS = {
    "value head size": (F.scaled_dot_product_attention, [(2, 3, 8, 4)] * 2 + [(2, 3, 8, 6)], torch.float32),
    "causal, scaled, float64": (
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3),
        [(2, 3, 8, 4)] * 2 + [(2, 3, 8, 6)],
        torch.float64,
    ),
    "transposed key": (
        lambda q, k, v: F.scaled_dot_product_attention(q, k.mT, v),
        [(2, 3, 8, 4), (2, 3, 4, 8), (2, 3, 8, 4)],
        torch.float32,
    ),
    "mask requires grad": (
        lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
        [(2, 3, 8, 4)] * 3 + [(2, 1, 8, 8)],
        torch.float32,
    ),
}


@pytest.mark.parametrize("name", MATH_CALLS)
def test_the_math_paths_backward_reads_the_probabilities_eager_keeps(name):
    fn, shapes, dtype = MATH_CALLS[name]
    _check(fn, _leaves(*shapes, dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_the_math_kernel_chosen_by_sdpa_kernel_saves_as_eager(dtype):
    fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    _check(fn, _leaves((2, 3, 8, 4), (2, 3, 8, 4), (2, 3, 8, 4), dtype=dtype), SDPBackend.MATH)


def test_3d_inputs_save_the_kernels_4d_output_as_eager():
    """Eager unsqueezes 3-D inputs for its CPU flash kernel, whose node saves the 4-D output."""
    fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    inputs = _leaves((3, 8, 4), (3, 8, 4), (3, 8, 4))
    shapes = []
    for f in (fn, thunder_rs.jit(fn)):
        with torch.autograd.graph.saved_tensors_hooks(lambda t: shapes.append(tuple(t.shape)) or t, lambda t: t):
            f(*inputs)
    assert sorted(shapes[:5]) == sorted(shapes[5:])
    _check(fn, inputs)


class _Attention(nn.Module):
    """A tiny HF-style self-attention: projections, heads split by view and transpose, SDPA with
    ``is_causal`` where no mask is given (else the 4-D additive mask), dropout 0, the output projection."""

    def __init__(self, embed: int = 16, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(embed, embed) for _ in range(4))

    def forward(self, x, mask=None):
        b, t, e = x.shape
        q, k, v = (p(x).view(b, t, self.heads, -1).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0, is_causal=mask is None and t > 1)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, e))


def _causal_additive(t: int):
    hidden = ~torch.ones(t, t, dtype=torch.bool).tril()
    return torch.zeros(1, 1, t, t).masked_fill(hidden, torch.finfo(torch.float32).min)


@pytest.mark.parametrize("autocast", [False, True], ids=["float32", "autocast bf16"])
@pytest.mark.parametrize("backend", [None, SDPBackend.MATH], ids=["default", "math kernel"])
@pytest.mark.parametrize("masked", [False, True], ids=["is_causal", "additive mask"])
def test_a_training_step_of_hf_style_attention_saves_and_differentiates_as_eager(backend, masked, autocast):
    torch.manual_seed(0)
    model = _Attention()
    embeddings = torch.randn(2, 8, 16, requires_grad=True)
    mask = _causal_additive(8) if masked else None
    params = [embeddings, *model.parameters()]

    def step(fn):
        packed = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t):
            with sdpa_kernel(backend) if backend is not None else torch.enable_grad():
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                    # (hidden states that are no leaf, as a model's are)
                    loss = fn(embeddings * 1.0, mask).float().square().mean()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            grads = torch.autograd.grad(loss, params)
        return loss, grads, _storages(packed), {e.name for e in prof.events()}

    loss, grads, saved, _ = step(model)
    jmodel = thunder_rs.jit(model)
    for _ in range(2):
        jit_loss, jit_grads, jit_saved, ran = step(jmodel)
        assert torch.equal(loss, jit_loss)
        assert all(torch.equal(a, b) for a, b in zip(grads, jit_grads, strict=True))
        assert jit_saved == saved
        assert not ran & _FORWARD_OPS
