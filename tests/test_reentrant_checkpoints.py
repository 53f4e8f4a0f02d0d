"""Reentrant activation checkpointing (``torch.utils.checkpoint(..., use_reentrant=True)``) trained
next to eager: gradients bit for bit.

What differed: eager's backward of a reentrant checkpoint is a backward of its own (the Function
runs the region again and calls ``torch.autograd.backward``), so an input of the region gets the
region's total, summed apart, added to its other gradients, and a parameter the region reads gets
the region's total added to its ``.grad``. The trace holds the region inline and summed every
gradient in one backward: the gradients of T5's and BART's checkpointed layers, and of an MLP of
checkpointed blocks with residuals around them, an ulp off eager's in some elements. The VJP pass
now sums each region apart (``passes::reentrant``). A ``.grad`` that holds a gradient already
(accumulation over micro-batches) gets the region totals added one by one in eager: the call's
total added once was an ulp off; the backward now returns each total and the runtime adds them in
turn (``run.autograd._land_in_turn``). A tensor a region reads without being passed it, computed
by the program, got the region's total in the outer backward; eager's region backward goes on
through the calls that computed it. Eager's forward runs the function without grad, where SDPA
takes its flash kernel for a mask that requires grad in the backward's recompute (the math path):
Swin's losses and gradients an ulp off; such a function is now traced both ways."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

import thunder_rs
from thunder_rs.errors import ThunderNotImplementedError

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.filterwarnings("ignore::UserWarning")]


class Blocks(nn.Module):
    """Three checkpointed blocks with residuals around them; ``shared``: one block three times;
    ``outside``: the first block's layer also used outside the checkpoints; ``nested``: a
    checkpoint inside each block, reading the head's weight."""

    def __init__(self, shared: bool = False, outside: bool = False, nested: bool = False):
        super().__init__()
        blocks = [nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 16)) for _ in range(3)]
        self.blocks = nn.ModuleList([blocks[0]] * 3 if shared else blocks)
        self.head = nn.Linear(16, 4)
        self.outside, self.nested = outside, nested

    def block(self, i: int, h: torch.Tensor) -> torch.Tensor:
        y = h + self.blocks[i](h) * h
        if self.nested:
            y = checkpoint(lambda z: z.sin() * self.head.weight.sum() + z, y, use_reentrant=True)
        return y

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        for i in range(3):
            h = h * 0.5 + checkpoint(self.block, i, h, use_reentrant=True)
        out = self.head(h)
        if self.outside:
            out = out + self.blocks[0][0](x).sum(-1, keepdim=True)
        return out.square().mean()


def _assert_grads_equal(model, eager, what: str) -> None:
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0, msg=lambda m, n=name: f"{what} {n}: {m}")


@pytest.mark.parametrize("leaf", [True, False], ids=["leaf_input", "computed_input"])
@pytest.mark.parametrize(
    "kind", [{}, {"shared": True}, {"outside": True}, {"shared": True, "outside": True}, {"nested": True}], ids=str
)
def test_checkpointed_blocks_get_eagers_gradients(kind, leaf):
    torch.manual_seed(0)
    model = Blocks(**kind)
    eager = copy.deepcopy(model)
    jmodel = thunder_rs.jit(model)
    for seed in range(3):
        for m in (model, eager):
            m.zero_grad()
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(seed), requires_grad=True)
        y = x.detach().clone().requires_grad_()
        actual = jmodel(x if leaf else x * 2)
        expected = eager(y if leaf else y * 2)
        actual.backward()
        expected.backward()
        torch.testing.assert_close(actual, expected, rtol=0, atol=0)
        torch.testing.assert_close(x.grad, y.grad, rtol=0, atol=0)
        _assert_grads_equal(model, eager, f"seed {seed}")
    assert thunder_rs.cache_misses(jmodel) == 1


def _t5():
    T = pytest.importorskip("transformers")
    config = dict(num_layers=2, num_heads=2, d_model=32, d_kv=16, d_ff=64, decoder_start_token_id=0)
    return T.T5ForConditionalGeneration(T.T5Config(vocab_size=99, pad_token_id=0, **config))


def _bart():
    T = pytest.importorskip("transformers")
    layers = dict(encoder_layers=2, decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2)
    sizes = dict(d_model=32, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64, vocab_size=99)
    tokens = dict(pad_token_id=0, decoder_start_token_id=2, bos_token_id=1, eos_token_id=2)
    return T.BartForConditionalGeneration(T.BartConfig(**layers, **sizes, **tokens))


def _batch(seed: int) -> dict:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 99, (2, 8), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, -2:] = 0
    return dict(input_ids=ids, attention_mask=mask, labels=torch.randint(3, 99, (2, 6), generator=generator))


@pytest.mark.slow
@pytest.mark.parametrize("build", [_t5, _bart], ids=["t5", "bart"])
def test_reentrant_checkpointed_seq2seq_training_is_eagers(build):
    """Three AdamW steps of T5 and BART with reentrant checkpointing (dropout included, eager's
    draws again in the backward): losses, gradients and parameters bit for bit."""
    torch.manual_seed(0)
    model = build().train()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    eager = copy.deepcopy(model)
    jmodel = thunder_rs.jit(model)
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (model, eager)]
    for step in range(3):
        losses = []
        for call, optimizer in zip((jmodel, eager), optimizers):
            optimizer.zero_grad()
            torch.manual_seed(step)
            loss = call(**_batch(step)).loss
            loss.backward()
            optimizer.step()
            losses.append(loss)
        torch.testing.assert_close(losses[0], losses[1], rtol=0, atol=0)
        _assert_grads_equal(model, eager, f"step {step}")
    for p, q in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    assert thunder_rs.cache_misses(jmodel) == 1


@pytest.mark.parametrize("kind", [{"shared": True}, {"shared": True, "outside": True}, {"nested": True}], ids=str)
def test_micro_batches_accumulate_onto_grad_as_eager(kind):
    """Two forwards and backwards before the optimizer's step (no ``zero_grad`` between): eager's
    backward of each region adds the region's total to a ``.grad`` that holds the first batch's
    gradient, one region after the other, and runs the parameter's hooks for each."""
    torch.manual_seed(0)
    model = Blocks(**kind)
    eager = copy.deepcopy(model)
    jmodel = thunder_rs.jit(model)
    calls = {"thunder_rs": 0, "eager": 0}
    for m, name in ((model, "thunder_rs"), (eager, "eager")):
        m.head.weight.register_post_accumulate_grad_hook(lambda p, n=name: calls.__setitem__(n, calls[n] + 1))
    for seed in range(3):
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(seed), requires_grad=True)
        y = x.detach().clone().requires_grad_()
        jmodel(x).backward()
        eager(y).backward()
        torch.testing.assert_close(x.grad, y.grad, rtol=0, atol=0)
        _assert_grads_equal(model, eager, f"batch {seed}")
    assert calls["thunder_rs"] == calls["eager"]
    assert thunder_rs.cache_misses(jmodel) == 1


class Captured(nn.Module):
    """Checkpoints whose functions read tensors that require grad without being passed them: a
    parameter, a tensor computed from one before the call, and the first checkpoint's output."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(16, 16)
        self.scale = nn.Parameter(torch.randn(16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.scale.sin()
        a = checkpoint(lambda z: self.linear(z) * h + self.scale, x, use_reentrant=True)
        b = checkpoint(lambda z: (z * a).tanh() * self.scale, x, use_reentrant=True)
        return b.square().mean() + (self.scale * x).mean()


def test_tensors_captured_by_checkpoints_get_eagers_gradients():
    """Eager's checkpoint backward (``torch.autograd.backward`` of what the function returned)
    goes on through the calls that computed a captured tensor: the second checkpoint's runs the
    first's backward and ``sin``'s, which add to ``scale.grad`` and ``x.grad`` within it, before
    the outer backward adds its own. Those gradients went to the outer backward, summed with its."""
    torch.manual_seed(0)
    model = Captured()
    eager = copy.deepcopy(model)
    jmodel = thunder_rs.jit(model)
    for seed in range(3):
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(seed), requires_grad=True)
        y = x.detach().clone().requires_grad_()
        actual, expected = jmodel(x), eager(y)
        actual.backward()
        expected.backward()
        torch.testing.assert_close(actual, expected, rtol=0, atol=0)
        torch.testing.assert_close(x.grad, y.grad, rtol=0, atol=0)
        _assert_grads_equal(model, eager, f"batch {seed}")
    assert thunder_rs.cache_misses(jmodel) == 1


def _captured_and_read_after(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    h = w.sin()
    return checkpoint(lambda a: (a * h).sin(), x, use_reentrant=True).sum() + h.sum()


def test_a_captured_tensor_the_program_also_differentiates_is_refused_naming_the_line():
    """Eager's checkpoint backward frees the graph of the calls that computed a captured tensor,
    and the outer backward through them fails; the trace would differentiate them twice."""
    w, x = torch.randn(4, requires_grad=True), torch.randn(4, requires_grad=True)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        _captured_and_read_after(w, x).backward()
    with pytest.raises(ThunderNotImplementedError, match=r"use_reentrant=True\) at .*test_reentrant"):
        thunder_rs.jit(_captured_and_read_after)(w, x).backward()


class BiasedAttention(nn.Module):
    """Attention with a learned bias, and a random mask (drop path), in a reentrant checkpoint."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(16, 48)
        self.bias = nn.Parameter(torch.randn(1, 2, 16, 16))

    def block(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (t.view(4, 16, 2, 8).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=self.bias * 1.0).transpose(1, 2).reshape(4, 16, 16)
        keep = torch.floor(torch.rand(4, 1, 1) + 0.75)
        return x + out / 0.75 * keep

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = checkpoint(self.block, x, use_reentrant=True)
        return checkpoint(self.block, h, use_reentrant=True).square().mean()


def test_attention_with_a_bias_requiring_grad_in_a_checkpoint_runs_eagers_kernels():
    """Eager's checkpoint runs the function without grad, where the bias requires none and SDPA
    takes its flash kernel, and again with grad in the backward, where it takes the math path
    (drawing the forward's random numbers again). The trace ran the math path once: the loss and
    the gradients an ulp off. The function is now traced both ways."""
    torch.manual_seed(0)
    model = BiasedAttention()
    eager = copy.deepcopy(model)
    jmodel = thunder_rs.jit(model)
    for seed in range(2):
        x = torch.randn(4, 16, 16, generator=torch.Generator().manual_seed(seed), requires_grad=True)
        y = x.detach().clone().requires_grad_()
        torch.manual_seed(seed)
        actual = jmodel(x)
        torch.manual_seed(seed)
        expected = eager(y)
        torch.testing.assert_close(actual, expected, rtol=0, atol=0)
        actual.backward()
        expected.backward()
        torch.testing.assert_close(x.grad, y.grad, rtol=0, atol=0)
        _assert_grads_equal(model, eager, f"batch {seed}")
    assert thunder_rs.cache_misses(jmodel) == 1


def _swin():
    T = pytest.importorskip("transformers")
    sizes = dict(image_size=32, patch_size=2, embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4)
    return T.SwinForImageClassification(T.SwinConfig(num_labels=3, **sizes))


@pytest.mark.slow
def test_reentrant_checkpointed_swin_trains_as_eager_bit_for_bit():
    """Three AdamW steps of Swin (attention with a relative position bias that requires grad,
    drop path) with reentrant checkpointing: losses, gradients and parameters bit for bit."""
    torch.manual_seed(0)
    model = _swin().train()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    eager = copy.deepcopy(model)
    jmodel = thunder_rs.jit(model)
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (model, eager)]
    for step in range(3):
        generator = torch.Generator().manual_seed(step)
        batch = dict(pixel_values=torch.randn(2, 3, 32, 32, generator=generator), labels=torch.tensor([0, 2]))
        losses = []
        for call, optimizer in zip((jmodel, eager), optimizers):
            optimizer.zero_grad()
            torch.manual_seed(step)
            out = call(**batch)
            out.loss.backward()
            optimizer.step()
            losses.append(out.logits)
        torch.testing.assert_close(losses[0], losses[1], rtol=0, atol=0)
        _assert_grads_equal(model, eager, f"step {step}")
    for p, q in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


def test_a_checkpoint_choosing_other_kernels_without_grad_that_draws_otherwise_is_refused_naming_the_line():
    """``torch.randn`` runs eagerly in a trace: its draw cannot be given again to the function
    traced without grad."""
    model = BiasedAttention()
    block = model.block
    model.block = lambda x: block(x) + torch.randn(16)
    x = torch.randn(4, 16, 16, requires_grad=True)
    with pytest.raises(ThunderNotImplementedError, match=r"use_reentrant=True\) at .*test_reentrant.*torch.rand"):
        thunder_rs.jit(model)(x)


def test_autograd_grad_through_reentrant_checkpoints_raises_eagers_error():
    """Eager's checkpoint backward accumulates into ``.grad``, which ``torch.autograd.grad`` does
    not read: it raises. The compiled backward adds some gradients to ``.grad`` in turn, and
    returned only the last."""
    model = Blocks(shared=True)
    x = torch.randn(8, 16, requires_grad=True)
    for call in (model, thunder_rs.jit(model)):
        with pytest.raises(RuntimeError, match="use_reentrant=True, torch.utils.checkpoint is incompatible with .grad"):
            torch.autograd.grad(call(x), [x, *model.parameters()])


@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non_reentrant"])
def test_micro_batches_accumulate_onto_grad_as_eager_under_torch_compile(reentrant, monkeypatch):
    """Dynamo passes a checkpointed region the parameters its function captures (graph inputs): a
    reentrant region's backward then returned their gradients to the outer backward, which summed
    them with the parameter's others into one ``.grad`` step, where eager's region backward adds
    its total to ``.grad`` by itself (an ulp off eager's from the second micro-batch on, and for a
    layer also used outside the regions). The backend has the region capture them again."""
    monkeypatch.setitem(
        globals(),
        "checkpoint",
        lambda fn, *args, **kw: torch.utils.checkpoint.checkpoint(fn, *args, **{**kw, "use_reentrant": reentrant}),
    )
    torch._dynamo.reset()
    for kind in ({"shared": True}, {"outside": True}):
        torch.manual_seed(0)
        model = Blocks(**kind)
        eager = copy.deepcopy(model)
        compiled = torch.compile(model, backend="thunder_rs")
        for seed in range(2):
            x = torch.randn(8, 16, generator=torch.Generator().manual_seed(seed), requires_grad=True)
            y = x.detach().clone().requires_grad_()
            compiled(x).backward()
            eager(y).backward()
            torch.testing.assert_close(x.grad, y.grad, rtol=0, atol=0)
            _assert_grads_equal(model, eager, f"{kind} batch {seed}")
