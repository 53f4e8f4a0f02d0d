"""Hugging Face transformers models under thunder_rs.jit, called as users call them, equal eager.

Tiny configs built in code (nothing downloaded), weights from a fixed seed. Each batch is what a
tokenizer gives for two texts of different lengths: ``input_ids`` padded on the left or the right,
``attention_mask`` with zeros at the padding, and ``labels`` with -100 there (class labels for
BERT). Every test runs the jitted model next to a deep copy run eagerly and compares loss, logits
and every parameter's gradient; the training tests also compare parameters after AdamW steps.

Dropout is on in train mode (GPT-2 and BERT default to p=0.1): both sides reseed before each call,
and thunder_rs draws eager's CPU masks under the same seed.
"""

import copy
import re

import pytest
import torch
from torch.utils._pytree import tree_flatten

import thunder_rs

transformers = pytest.importorskip("transformers")
from transformers import masking_utils  # noqa: E402

VOCAB = 99
PAD = 0
BATCH, SEQ = 2, 8
LENGTHS = (SEQ, 5)  # the second text is padded
LR = 1e-3
ADAMW_STEPS = 3

# float32: the backward sums in another order than eager's (a few ulps per gradient), and AdamW
# turns a relative gradient error into the same relative error of an update of size <= LR; float64
# the same with ulps of 1e-16. See tests/test_training.py for the measured margins.
TOLERANCES = {torch.float32: dict(rtol=1e-4, atol=1e-5), torch.float64: dict(rtol=1e-10, atol=1e-10)}


pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_model(name: str, dtype: torch.dtype = torch.float32, attn: str = "sdpa") -> torch.nn.Module:
    """A two-layer model of the family ``name`` with seeded weights, in train mode (Mamba has no
    attention, so ``attn`` is not its)."""
    torch.manual_seed(0)
    common = dict(vocab_size=VOCAB, pad_token_id=PAD, attn_implementation=attn)
    if name == "gpt2":
        config = transformers.GPT2Config(
            n_layer=2, n_head=2, n_embd=32, n_positions=64, bos_token_id=1, eos_token_id=2, **common
        )
        model = transformers.GPT2LMHeadModel(config)
    elif name == "llama":
        config = transformers.LlamaConfig(
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            hidden_size=32,
            intermediate_size=64,
            max_position_embeddings=64,
            bos_token_id=1,
            eos_token_id=2,
            **common,
        )
        model = transformers.LlamaForCausalLM(config)
    elif name == "mamba":
        config = transformers.MambaConfig(
            num_hidden_layers=2,
            hidden_size=16,
            state_size=8,
            expand=2,
            conv_kernel=4,
            vocab_size=VOCAB,
            pad_token_id=PAD,
        )
        model = transformers.MambaForCausalLM(config)
    else:
        config = transformers.BertConfig(
            num_hidden_layers=2,
            num_attention_heads=2,
            hidden_size=32,
            intermediate_size=64,
            max_position_embeddings=64,
            num_labels=3,
            **common,
        )
        model = transformers.BertForSequenceClassification(config)
    return model.to(dtype).train()


def padded_batch(name: str, side: str, seed: int = 0) -> dict:
    """Two texts of ``LENGTHS`` tokens, padded to ``SEQ`` on ``side``, as a tokenizer returns them."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (BATCH, SEQ), generator=g)
    mask = torch.zeros(BATCH, SEQ, dtype=torch.long)
    for row, length in enumerate(LENGTHS):
        if side == "left":
            mask[row, SEQ - length :] = 1
        else:
            mask[row, :length] = 1
    ids = ids.masked_fill(mask == 0, PAD)
    if name == "bert":
        labels = torch.randint(0, 3, (BATCH,), generator=g)
    else:
        labels = ids.masked_fill(mask == 0, -100)
    return dict(input_ids=ids, attention_mask=mask, labels=labels)


def call_both(jmodel, eager, batch: dict, seed: int = 1):
    """Both models on ``batch``, reseeded alike so that dropout draws the same masks."""
    torch.manual_seed(seed)
    out = jmodel(**batch)
    torch.manual_seed(seed)
    ref = eager(**batch)
    return out, ref


def assert_outputs_close(out, ref, tol: dict) -> None:
    assert type(out) is type(ref)
    assert list(out.keys()) == list(ref.keys())
    torch.testing.assert_close(out.loss, ref.loss, **tol)
    torch.testing.assert_close(out.logits, ref.logits, **tol)


def assert_grads_close(model, eager, tol: dict) -> None:
    eager_params = dict(eager.named_parameters())
    for name, p in model.named_parameters():
        expected = eager_params[name].grad
        assert (p.grad is None) == (expected is None), name
        if expected is not None:
            torch.testing.assert_close(p.grad, expected, **tol, msg=lambda m: f"grad of {name}: {m}")


def forward_backward(name: str, side: str, mode: str, dtype=torch.float32, attn: str = "sdpa", **options):
    model = getattr(tiny_model(name, dtype, attn), mode)()
    eager = copy.deepcopy(model)
    jmodel = thunder_rs.jit(model, **options)
    out, ref = call_both(jmodel, eager, padded_batch(name, side))
    tol = TOLERANCES[dtype]
    assert_outputs_close(out, ref, tol)
    out.loss.backward()
    ref.loss.backward()
    assert_grads_close(model, eager, tol)
    return jmodel


MODELS = ("gpt2", "llama", "bert")
#: BERT's classifier sets ``config.problem_type`` on its first call with labels (eager keeps it): the
#: second call sees the changed config and compiles once more, then hits.
LAZY_CONFIG_COMPILES = {"bert": 2}


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("name", MODELS)
def test_forward_and_backward_match_eager(name, side, mode):
    jmodel = forward_backward(name, side, mode)
    assert thunder_rs.cache_misses(jmodel) == 1


@pytest.mark.parametrize("name", MODELS)
def test_models_run_without_eager_fallbacks(name):
    assert thunder_rs.examine(tiny_model(name), **padded_batch(name, "left")).fallbacks == {}


@pytest.mark.parametrize("name", MODELS)
def test_float64_forward_and_backward_match_eager(name):
    forward_backward(name, "left", "train", torch.float64)


@pytest.mark.inductor
@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n == "gpt2" else pytest.mark.slow) for n in MODELS])
def test_inductor_regions_compile_and_match_eager(name):
    """With the Inductor executor every region compiles (none falls back to its eager calls,
    GPT-2's attention once did) and the model still equals eager."""
    from thunder_rs.executors import inductor_ex

    before = inductor_ex.stats()
    forward_backward(name, "left", "train", executors=["inductor"])
    after = inductor_ex.stats()
    assert after.failures == before.failures
    assert after.misses + after.hits > before.misses + before.hits


# The eager attention path builds an additive float mask (torch.where(mask, 0, finfo.min)) and
# runs softmax in float32; sdpa takes the boolean mask. float64 with left padding is left out:
# there eager itself returns NaN (finfo(float64).min becomes -inf in its float32 softmax).
@pytest.mark.parametrize("name", MODELS)
def test_eager_attention_matches_eager(name):
    forward_backward(name, "left", "train", attn="eager")


def enable_checkpointing(model, use_reentrant: bool = False) -> None:
    """Activation checkpointing (``activation_checkpointing_enable`` in 5.x, the older name in 4.x)."""
    kwargs = {"use_reentrant": use_reentrant}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


@pytest.mark.parametrize("use_reentrant", [False, True], ids=["non_reentrant", "reentrant"])
@pytest.mark.parametrize("name", MODELS)
def test_gradient_checkpointing_matches_eager(name, use_reentrant):
    """Checkpointed layers recompute in eager's backward; in a trace they are ordinary calls, and
    their parameters get gradients. The reentrant form runs each layer inside an autograd.Function
    whose forward torch calls with grad mode off: the trace must still differentiate it. The
    embedding hook that makes the checkpointed inputs require grad (``requires_grad_(True)`` on a
    tensor that already does) is a no-op."""
    model = tiny_model(name)
    enable_checkpointing(model, use_reentrant)
    eager = copy.deepcopy(model)
    out, ref = call_both(thunder_rs.jit(model), eager, padded_batch(name, "right"))
    assert_outputs_close(out, ref, TOLERANCES[torch.float32])
    out.loss.backward()
    ref.loss.backward()
    assert_grads_close(model, eager, TOLERANCES[torch.float32])


def test_checkpointing_with_a_frozen_embedding_matches_eager_or_is_refused_with_the_line():
    """transformers 5 hooks the frozen embedding to make its output require grad
    (``make_inputs_require_grads``): a trace cannot change which values are differentiable, and
    says so at that line. transformers 4.55 adds the hook only for PEFT models: there the step
    must equal eager."""
    model = tiny_model("llama")
    enable_checkpointing(model)
    model.get_input_embeddings().weight.requires_grad_(False)
    eager = copy.deepcopy(model)
    try:
        out, ref = call_both(thunder_rs.jit(model), eager, padded_batch("llama", "right"))
    except NotImplementedError as e:
        assert re.search(r"requires_grad=True on a traced tensor.*modeling_utils\.py:\d+", str(e)), e
        return
    out.loss.backward()
    ref.loss.backward()
    assert_grads_close(model, eager, TOLERANCES[torch.float32])


def exact_zero_grad(name: str, model) -> torch.Tensor | None:
    """A mask of the parameter entries whose gradient is zero in exact arithmetic, so rounding
    noise (different in the two runs) that AdamW scales up to +-LR: the key projection's bias
    (softmax ignores a per-query constant)."""
    param = dict(model.named_parameters())[name]
    mask = torch.zeros_like(param, dtype=torch.bool)
    if name.endswith("attn.c_attn.bias"):  # GPT-2: q, k, v biases in one vector
        n = model.config.n_embd
        mask[n : 2 * n] = True
    elif name.endswith("attention.self.key.bias"):  # BERT
        mask[:] = True
    return mask if mask.any() else None


def assert_params_close(name: str, model, eager, tol: dict, steps: int) -> None:
    eager_params = dict(eager.named_parameters())
    for pname, p in model.named_parameters():
        actual, expected = p.detach(), eager_params[pname].detach()
        noise = exact_zero_grad(pname, model)
        if noise is not None:
            torch.testing.assert_close(actual[noise], expected[noise], rtol=0, atol=2 * steps * LR)
            actual, expected = actual[~noise], expected[~noise]
        torch.testing.assert_close(actual, expected, **tol, msg=lambda m: f"{name} {pname} after {steps} steps: {m}")


@pytest.mark.parametrize(
    "name,dtype",
    [
        ("gpt2", torch.float32),
        ("llama", torch.float32),
        ("bert", torch.float32),
        ("llama", torch.float64),
    ],
    ids=["gpt2", "llama", "bert", "llama-float64"],
)
def test_adamw_steps_match_eager(name, dtype):
    model = tiny_model(name, dtype)
    eager = copy.deepcopy(model)
    jmodel = thunder_rs.jit(model)
    optimizers = [torch.optim.AdamW(m.parameters(), lr=LR) for m in (model, eager)]
    tol = TOLERANCES[dtype]
    for step in range(ADAMW_STEPS):
        # A new batch each step, padded on alternating sides: same shapes, so the cache is hit
        # with new mask values.
        batch = padded_batch(name, ("left", "right")[step % 2], seed=step)
        for opt in optimizers:
            opt.zero_grad(set_to_none=True)
        out, ref = call_both(jmodel, eager, batch, seed=step)
        assert_outputs_close(out, ref, tol)
        out.loss.backward()
        ref.loss.backward()
        assert_grads_close(model, eager, tol)
        for opt in optimizers:
            opt.step()
        assert_params_close(name, model, eager, tol, step + 1)
    stats = thunder_rs.compile_stats(jmodel)
    misses = LAZY_CONFIG_COMPILES.get(name, 1)
    assert (stats.cache_misses, stats.cache_hits) == (misses, ADAMW_STEPS - misses), stats.miss_reasons


@pytest.mark.parametrize("name", MODELS)
def test_padding_is_read_from_the_mask_at_every_call(name):
    """The first batch has no padding, which eager's mask code reads (by value) to leave the mask
    out; the trace reads it as eager does, with a check at every call: the padded batches of the
    same shape run a second variant, which builds the mask, and still match eager; an unpadded
    batch after them runs the first again."""
    model = tiny_model(name).eval()
    jmodel = thunder_rs.jit(model)
    unpadded = padded_batch(name, "right")
    unpadded["attention_mask"] = torch.ones_like(unpadded["attention_mask"])
    for batch in (unpadded, padded_batch(name, "left"), padded_batch(name, "right"), unpadded):
        with torch.no_grad():
            out, ref = call_both(jmodel, model, batch)
        assert_outputs_close(out, ref, TOLERANCES[torch.float32])
    assert thunder_rs.cache_misses(jmodel) == LAZY_CONFIG_COMPILES.get(name, 1) + 1


def cache_tensors(cache) -> list:
    """The key and value tensors of each layer of a returned cache: a ``DynamicCache`` (which
    iterates over its layers in transformers 4.55 and 5.x) or 4.55's legacy tuple of tuples."""
    return [t for layer in cache for t in layer[:2]]


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_returned_cache_holds_this_calls_tensors(name):
    """``use_cache`` is on by default: the output's ``past_key_values`` is a new object per call,
    holding real tensors equal to eager's, and eager decoding can continue from it."""
    model = tiny_model(name).eval()
    jmodel = thunder_rs.jit(model)
    batch = padded_batch(name, "left")
    del batch["labels"]
    with torch.no_grad():
        first, second, ref = jmodel(**batch), jmodel(**batch), model(**batch)
    cache = second.past_key_values
    assert type(cache) is type(ref.past_key_values)
    assert cache is not first.past_key_values
    tensors, expected = cache_tensors(cache), cache_tensors(ref.past_key_values)
    assert len(tensors) == len(expected) == 4
    for t, e, old in zip(tensors, expected, cache_tensors(first.past_key_values)):
        assert type(t) is torch.Tensor and t is not old
        torch.testing.assert_close(t, e)
    step = dict(
        input_ids=torch.tensor([[5], [7]]),
        attention_mask=torch.cat([batch["attention_mask"], torch.ones(BATCH, 1, dtype=torch.long)], 1),
    )
    with torch.no_grad():
        continued = model(**step, past_key_values=cache).logits
        expected = model(**step, past_key_values=ref.past_key_values).logits
    torch.testing.assert_close(continued, expected)


def test_a_cache_passed_in_matches_eager_and_is_updated_as_eager_updates_it():
    # DynamicLayer.update sets ``self.keys = torch.cat(...)`` on layers reached through a list
    # (cache.layers[i]): every call sets them again, to its own tensors (tests/test_kv_cache.py).
    model = tiny_model("llama").eval()
    jmodel = thunder_rs.jit(model)
    prompt = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        cache = model(prompt).past_key_values
        ref_cache = copy.deepcopy(cache)
        expected = model(torch.tensor([[9]]), past_key_values=ref_cache).logits
        actual = jmodel(torch.tensor([[9]]), past_key_values=cache).logits
    torch.testing.assert_close(actual, expected)
    for layer, ref_layer in zip(cache.layers, ref_cache.layers):
        assert type(layer.keys) is torch.Tensor and type(layer.values) is torch.Tensor
        torch.testing.assert_close(layer.keys, ref_layer.keys)
        torch.testing.assert_close(layer.values, ref_layer.values)


def test_a_config_change_between_calls_is_seen():
    # capture_outputs (utils/output_capturing.py) reads getattr(self.config, f"output_{k}"): a name the
    # observer cannot see in the bytecode; the config is guarded whole.
    model = tiny_model("gpt2").eval()
    jmodel = thunder_rs.jit(model)
    batch = padded_batch("gpt2", "left")
    with torch.no_grad():
        assert jmodel(**batch).hidden_states is None
        model.config.output_hidden_states = True
        out, ref = jmodel(**batch), model(**batch)
    assert out.hidden_states is not None and len(out.hidden_states) == len(ref.hidden_states)


def test_the_jitted_module_forwards_attributes_and_generate():
    model = tiny_model("gpt2").eval()
    jmodel = thunder_rs.jit(model)
    assert jmodel.config is model.config
    assert jmodel.num_parameters() == model.num_parameters()
    batch = padded_batch("gpt2", "left")
    # generate() is the wrapped model's own, calling the model through the jit: eager's tokens,
    # from compiled forwards (tests/test_kv_cache.py).
    kwargs = dict(attention_mask=batch["attention_mask"], max_new_tokens=3, do_sample=False, pad_token_id=PAD)
    torch.testing.assert_close(
        jmodel.generate(batch["input_ids"], **kwargs), model.generate(batch["input_ids"], **kwargs)
    )
    assert thunder_rs.compile_stats(jmodel).calls == 3
    with pytest.raises(AttributeError):
        jmodel.no_such_attribute
    assert list(jmodel.state_dict()) == list(model.state_dict())


def test_is_compiling_is_true_while_tracing_only():
    class Probe(torch.nn.Module):
        def forward(self, x):
            self.seen = (torch.compiler.is_compiling(), transformers.utils.is_torchdynamo_compiling())
            if x.shape[0] == 0:
                raise ValueError("empty")
            return x * 2

    probe = Probe()
    jprobe = thunder_rs.jit(probe)
    jprobe(torch.ones(2))
    assert probe.seen == (True, True)
    assert not torch.compiler.is_compiling()
    with pytest.raises(ValueError):
        jprobe(torch.ones(0))
    assert not torch.compiler.is_compiling()


MASK_BUILDERS = {
    "sdpa_causal": lambda mask: masking_utils.sdpa_mask(
        batch_size=BATCH, q_length=SEQ, kv_length=SEQ, attention_mask=mask.bool()
    ),
    "eager_causal": lambda mask: masking_utils.eager_mask(
        batch_size=BATCH, q_length=SEQ, kv_length=SEQ, attention_mask=mask.bool(), dtype=torch.float32
    ),
    "sdpa_bidirectional": lambda mask: masking_utils.sdpa_mask(
        batch_size=BATCH,
        q_length=SEQ,
        kv_length=SEQ,
        attention_mask=mask.bool(),
        allow_is_causal_skip=False,
        mask_function=masking_utils.bidirectional_mask_function,
    ),
    "sdpa_sliding_window": lambda mask: masking_utils.sdpa_mask(
        batch_size=BATCH,
        q_length=SEQ,
        kv_length=SEQ,
        attention_mask=mask.bool(),
        mask_function=masking_utils.sliding_window_causal_mask_function(3),
        local_size=3,
    ),
    # use_vmap=True: what 5.x does for custom mask functions, and 4.x for every mask.
    "sdpa_causal_vmap": lambda mask: masking_utils.sdpa_mask(
        batch_size=BATCH, q_length=SEQ, kv_length=SEQ, attention_mask=mask.bool(), use_vmap=True
    ),
    "sdpa_chunked_vmap": lambda mask: masking_utils.sdpa_mask(
        batch_size=BATCH,
        q_length=SEQ,
        kv_length=SEQ,
        attention_mask=mask.bool(),
        use_vmap=True,
        allow_is_causal_skip=False,
        mask_function=masking_utils.chunked_causal_mask_function(3, mask.argmax(-1)),
    ),
}


@pytest.mark.skipif(int(transformers.__version__.split(".")[0]) < 5, reason="transformers 5's masking_utils API")
@pytest.mark.parametrize("side", ["left", "right", "none"])
@pytest.mark.parametrize("builder", MASK_BUILDERS)
def test_mask_construction_matches_eager(builder, side):
    mask = padded_batch("gpt2", "left" if side == "none" else side)["attention_mask"]
    if side == "none":
        mask = torch.ones_like(mask)
    build = MASK_BUILDERS[builder]
    expected = build(mask)
    actual = thunder_rs.jit(build)(mask)
    if expected is None:
        # Eager read the mask, found no padding and left causality to sdpa's is_causal; the trace
        # reads it too (checked at every call), and leaves the mask out as eager does.
        assert builder.startswith("sdpa_causal") and side == "none"
        assert actual is None
    else:
        torch.testing.assert_close(actual, expected.expand_as(actual))


def test_outputs_hold_no_proxies():
    model = tiny_model("llama").eval()
    with torch.no_grad():
        out = thunder_rs.jit(model)(**padded_batch("llama", "right"), output_hidden_states=True)
    leaves = tree_flatten(out)[0] + cache_tensors(out.past_key_values)
    assert all(type(t) is torch.Tensor for t in leaves if isinstance(t, torch.Tensor))


@pytest.mark.skipif(int(transformers.__version__.split(".")[0]) < 5, reason="transformers 5's rope_parameters")
def test_dynamic_rope_matches_eager():
    """Dynamic RoPE picks its frequencies from the largest position id, a value the trace is
    specialised on (``core.values``), and grows or resets them in module state as eager does."""
    config = transformers.LlamaConfig(
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        hidden_size=32,
        intermediate_size=64,
        vocab_size=VOCAB,
        max_position_embeddings=4,
        rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0},
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    eager = copy.deepcopy(model)
    jmodel = thunder_rs.jit(model)
    ids = padded_batch("llama", "left")["input_ids"]
    for n in (SEQ, 3, SEQ, 6):  # past the 4 positions (grows), under them (resets)
        torch.testing.assert_close(jmodel(ids[:, :n]).logits, eager(ids[:, :n]).logits)


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_mamba_forward_and_backward_match_eager(mode):
    """Mamba's selective scan: while tracing ``is_compiling()`` is True, so transformers takes its
    ``associative_scan`` path (log2(seq) rounds of a vmapped combine) where eager runs a loop
    over the sequence; the two compute the same recurrence, summed in another order."""
    model = getattr(tiny_model("mamba"), mode)()
    eager = copy.deepcopy(model)
    jmodel = thunder_rs.jit(model)
    tol = TOLERANCES[torch.float32]
    # The padding mask is multiplied in, so another padding is the same program.
    for side, seed in (("right", 0), ("left", 1)):
        out, ref = call_both(jmodel, eager, padded_batch("mamba", side, seed))
        assert_outputs_close(out, ref, tol)
        out.loss.backward()
        ref.loss.backward()
        assert_grads_close(model, eager, tol)
    assert thunder_rs.cache_misses(jmodel) == 1
    assert thunder_rs.examine(tiny_model("mamba"), **padded_batch("mamba", "right")).fallbacks == {}


@pytest.mark.slow
def test_mamba_trains_over_batch_sizes_in_two_compiles():
    """The scan's ``result.shape.numel() > 0`` (torch's ``associative_scan``) specialised the
    batch: a compile per batch size. Its numel is symbolic with the batch."""
    model = tiny_model("mamba")
    eager = copy.deepcopy(model)
    jmodel = thunder_rs.jit(model)
    tol = TOLERANCES[torch.float32]
    g = torch.Generator().manual_seed(0)
    for batch in (2, 3, 4, 5):
        ids = torch.randint(3, VOCAB, (batch, SEQ), generator=g)
        out, ref = call_both(jmodel, eager, dict(input_ids=ids, labels=ids))
        assert_outputs_close(out, ref, tol)
        out.loss.backward()
        ref.loss.backward()
        assert_grads_close(model, eager, tol)
        model.zero_grad(set_to_none=True)
        eager.zero_grad(set_to_none=True)
    assert thunder_rs.cache_misses(jmodel) == 2, thunder_rs.compile_stats(jmodel).miss_reasons
