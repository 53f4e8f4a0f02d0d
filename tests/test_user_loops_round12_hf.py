"""HF generation as users run it, round 12 (hand-written decoders: ``test_user_loops_round12.py``):
a tiny Llama (Mistral for a sliding window) built in code, with the whole module jitted and
``generate`` called on it, with only its ``forward`` jitted, and with its ``forward`` under
``torch.compile(backend="thunder_rs")`` (next to Dynamo's own ``backend="eager"``: transformers
takes other paths when it is told it is compiled). What the other generation tests leave out:
beam sampling, a static cache under beams, several end tokens ending rows of a sampled batch,
``custom_generate`` given a user's function, a prompt given as embeddings, REINFORCE on sampled
text, a LoRA adapter trained and switched off between generates, a model moved to bfloat16 and
back, and users' loops over HF caches: sampling from a seeded generator with rows ending at their
own steps and the cache passed back by hand, beams reordering the cache between calls, assisted
decoding by hand cropping the cache, a static sliding-window cache past its window, a streaming
Python generator stopped early. Each: eager's tokens, scores, caches, parameters, gradients,
optimizer state and RNG state bit for bit, the compiles counted.

What differed: an FP8-quantized cache (``QuantizedCache(backend="fp8")``, or ``generate`` with
``cache_implementation="quantized"``) casts to ``float8_e4m3fn``, which the trace cannot hold: the
error was a plain ``TypeError`` that named neither the op nor the line, and, taken for the
program's own error, it left the cache's layers as the traced call had half-made them
(``is_initialized`` set, no keys), so that eager then failed on the same cache. It is now a
refusal naming ``Tensor.to`` and the line, and the cache is left as it was."""

import copy
import inspect

import pytest
import torch

import thunder_rs
from thunder_rs.dynamo import compiled_graphs
from thunder_rs.errors import ThunderTypeError

transformers = pytest.importorskip("transformers")
if (
    not hasattr(transformers, "QuantizedCache")
    or "cache" not in inspect.signature(transformers.LlamaModel.forward).parameters
):
    pytest.skip("transformers >= 5.24: Cache.layers, the forward's cache argument", allow_module_level=True)

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.filterwarnings("ignore:thunder_rs.*recompiled"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
]
T = transformers
SLOW = pytest.mark.slow
VOCAB = 99
BODY = dict(
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    hidden_size=32,
    intermediate_size=64,
    max_position_embeddings=128,
    vocab_size=VOCAB,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
RETURNED = dict(pad_token_id=0, return_dict_in_generate=True, output_scores=True, output_logits=True)
NO_EOS = dict(RETURNED, eos_token_id=None)


def llama():
    return T.LlamaForCausalLM(T.LlamaConfig(**BODY))


def mistral():
    return T.MistralForCausalLM(T.MistralConfig(sliding_window=5, **BODY))


def prompts(batch: int = 3) -> dict:
    """Prompts of 7, 4 and 6 tokens, padded on the left."""
    ids = torch.randint(3, VOCAB, (3, 7), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    for row, pads in ((1, 3), (2, 1)):
        ids[row, :pads], mask[row, :pads] = 0, 0
    return dict(input_ids=ids[:batch], attention_mask=mask[:batch])


def grown(mask, n: int = 1):
    return torch.cat([mask, torch.ones(mask.shape[0], n, dtype=mask.dtype)], 1)


def flat(value):
    """``value`` as nested lists of tensors and plain values: a cache as its layers' attributes
    (tensors, lengths, flags), a ``ModelOutput`` as its items."""
    if isinstance(value, T.Cache):
        return [flat(sorted(vars(layer).items())) for layer in value.layers]
    if isinstance(value, T.utils.ModelOutput):
        return [(k, flat(v)) for k, v in value.items()]
    if isinstance(value, (list, tuple)):
        return [flat(v) for v in value]
    return value


def assert_same(got, expected, path: str = "result") -> None:
    """Tensors bit for bit (dtype, ``requires_grad``, shape), the rest equal, item by item."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(got, torch.Tensor), path
        assert (got.dtype, got.requires_grad) == (expected.dtype, expected.requires_grad), path
        torch.testing.assert_close(got, expected, rtol=0, atol=0, msg=lambda m: f"{path}: {m}")
    elif isinstance(expected, (list, tuple)):
        assert isinstance(got, (list, tuple)) and len(got) == len(expected), path
        for i, (g, e) in enumerate(zip(got, expected)):
            assert_same(g, e, f"{path}[{i}]")
    else:
        assert got == expected, f"{path}: {got!r} != {expected!r}"


def ran(recipe, build, how: str) -> tuple:
    """``recipe(call, model)`` from seed 7 on ``build()`` (from seed 0) as ``how`` runs it: what it
    returned, the model's state and gradients, the RNG state; and the compile counts."""
    torch.manual_seed(0)
    model, call = build().eval(), None
    if how == "jit":
        call = thunder_rs.jit(model)
    elif how == "forward":
        model.forward = thunder_rs.jit(model.forward)
    elif how in ("compile", "dynamo_eager"):
        torch._dynamo.reset()
        before = compiled_graphs()
        model.forward = torch.compile(model.forward, backend="eager" if how == "dynamo_eager" else "thunder_rs")
    torch.manual_seed(7)
    out = flat(recipe(call or model, model))
    state = [t.clone() for t in model.state_dict().values()] + [p.grad for p in model.parameters()]
    counts = None
    if how in ("jit", "forward"):
        stats = thunder_rs.compile_stats(call if how == "jit" else model.forward)
        assert stats.eager_calls == 0, stats
        counts = stats.cache_misses
    elif how == "compile":
        new = [g for g in compiled_graphs() if all(g is not b for b in before)]
        counts = [thunder_rs.cache_misses(g.jitted) for g in new if g.jitted is not None]
        assert counts, "nothing compiled"
    return (out, state, torch.get_rng_state()), counts


def generates_as_eager(recipe, how: str, build=llama):
    """``recipe`` as ``how`` runs it computes what eager does (under ``torch.compile``, what
    Dynamo's own backend does). Returns the compile counts."""
    got, counts = ran(recipe, build, how)
    expected, _ = ran(recipe, build, "dynamo_eager" if how == "compile" else "eager")
    assert_same(got, expected)
    return counts


# --------------------------------------------------------------------------- the recipes


def beam_sample(call, model):
    return call.generate(**prompts(), max_new_tokens=6, num_beams=3, do_sample=True, top_k=8, **NO_EOS)


def static_beams(call, model):
    return call.generate(**prompts(), max_new_tokens=5, num_beams=2, cache_implementation="static", **NO_EOS)


def several_ends(call, model):
    """Sampling with three end tokens: the rows end at steps 7, 3 and 1 of at most 10, padded after."""
    return call.generate(**prompts(), max_new_tokens=10, do_sample=True, eos_token_id=[2, 46, 33], **RETURNED)


def custom_generate(call, model):
    """``generate(custom_generate=fn)``: the user's greedy loop over a ``DynamicCache``."""

    def greedy(model, input_ids, generation_config=None, logits_processor=None, stopping_criteria=None, **kwargs):
        cache, ids, mask, feed = T.DynamicCache(config=model.config), input_ids, kwargs["attention_mask"], input_ids
        for _ in range(5):
            feed = model(input_ids=feed, attention_mask=mask, cache=cache, use_cache=True).logits[:, -1:].argmax(-1)
            ids, mask = torch.cat([ids, feed], 1), grown(mask)
        return ids, cache

    return call.generate(**prompts(), custom_generate=greedy)


def contrastive_search(
    model, input_ids, generation_config=None, logits_processor=None, stopping_criteria=None, **kwargs
):
    """Contrastive search by hand (transformers 5 moved it out of the library): each step the top
    three candidates are run over the cache repeated per candidate (``batch_repeat_interleave``),
    scored by probability less their hidden state's greatest cosine similarity to the context's,
    and the chosen candidates' rows kept (``batch_select_indices``)."""
    cache, mask, k, alpha = T.DynamicCache(config=model.config), kwargs["attention_mask"], 3, 0.6
    out = model(input_ids=input_ids, attention_mask=mask, cache=cache, use_cache=True, output_hidden_states=True)
    context, logits, ids, rows = out.hidden_states[-1], out.logits[:, -1], input_ids, input_ids.shape[0]
    for _ in range(5):
        top_p, top_ids = logits.softmax(-1).topk(k, -1)
        cache.batch_repeat_interleave(k)
        mask = grown(mask)
        candidates = model(
            input_ids=top_ids.reshape(-1, 1),
            attention_mask=mask.repeat_interleave(k, 0),
            cache=cache,
            use_cache=True,
            output_hidden_states=True,
        )
        h = candidates.hidden_states[-1][:, -1].view(rows, k, -1)
        similar = torch.nn.functional.cosine_similarity(h[:, :, None], context[:, None], dim=-1).amax(-1)
        best = ((1 - alpha) * top_p - alpha * similar).argmax(-1)
        chosen = torch.arange(rows) * k + best
        cache.batch_select_indices(chosen)
        ids = torch.cat([ids, top_ids.gather(1, best[:, None])], 1)
        context = torch.cat([context, h[torch.arange(rows), best][:, None]], 1)
        logits = candidates.logits[chosen, -1]
    return ids, cache


def contrastive(call, model):
    return call.generate(**prompts(), custom_generate=contrastive_search)


def from_embeddings(call, model):
    """A prompt given as embeddings (scaled, as a soft prompt would change them)."""
    ids, mask = prompts().values()
    embeddings = model.get_input_embeddings()(ids) * 1.5
    return call.generate(inputs_embeds=embeddings, attention_mask=mask, max_new_tokens=5, **NO_EOS)


def reinforce(call, model):
    """Two rounds: four tokens sampled under ``no_grad``, then Adam on REINFORCE's loss (their
    log-probabilities through the same model, rewarded for odd tokens, a mean baseline)."""
    optimizer, out = torch.optim.Adam(model.parameters(), lr=1e-3), []
    mask = grown(prompts()["attention_mask"], 4)
    for _ in range(2):
        with torch.no_grad():
            sampled = call.generate(**prompts(), max_new_tokens=4, do_sample=True, pad_token_id=0, eos_token_id=None)
        logits = call(input_ids=sampled, attention_mask=mask).logits[:, 6:-1]
        log_p = logits.log_softmax(-1).gather(2, sampled[:, 7:, None]).squeeze(2)
        reward = (sampled[:, 7:] % 2).float()
        loss = -(log_p * (reward - reward.mean())).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        out.append((sampled, loss.detach()))
    return out, [t for kept in optimizer.state.values() for t in kept.values()]


def dropout_llama():
    return T.LlamaForCausalLM(T.LlamaConfig(**BODY, attention_dropout=0.2))


def sampled_then_trained_with_dropout(call, model):
    """Twice: sampled under ``inference_mode`` in ``eval()``, then in ``train()`` an AdamW step on
    the language-model loss of the samples (cloned out of inference mode) with attention dropout
    drawing from the global generator."""
    optimizer, out, mask = torch.optim.AdamW(model.parameters(), lr=1e-3), [], grown(prompts()["attention_mask"], 3)
    for _ in range(2):
        model.eval()
        with torch.inference_mode():
            sampled = call.generate(**prompts(), max_new_tokens=3, do_sample=True, pad_token_id=0, eos_token_id=None)
        sampled = sampled.clone()
        model.train()
        loss = call(input_ids=sampled, attention_mask=mask, labels=sampled).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        out.append((sampled, loss.detach()))
    return out, [t for kept in optimizer.state.values() for t in kept.values()]


def bfloat16_and_back(call, model):
    out = []
    for dtype in (torch.float32, torch.bfloat16, torch.float32):
        model.to(dtype)
        out.append(call.generate(**prompts(), max_new_tokens=4, **NO_EOS))
    return out


class LoRA(torch.nn.Module):
    """A frozen linear layer plus a trainable low-rank update, switched by ``enabled``."""

    def __init__(self, base: torch.nn.Linear, rank: int = 2):
        super().__init__()
        self.base, self.enabled = base, True
        self.a = torch.nn.Parameter(torch.randn(rank, base.in_features) * 0.1)
        self.b = torch.nn.Parameter(torch.randn(base.out_features, rank) * 0.1)

    def forward(self, x):
        y = self.base(x)
        return y + x @ self.a.t() @ self.b.t() if self.enabled else y


def lora_llama():
    model = llama().requires_grad_(False)
    for layer in model.model.layers:
        layer.self_attn.q_proj, layer.self_attn.v_proj = LoRA(layer.self_attn.q_proj), LoRA(layer.self_attn.v_proj)
    return model


def lora_session(call, model):
    """Generate; an SGD step on the adapters' language-model loss over the generated text;
    generate; switch the adapters off; generate."""
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    out = [call.generate(**prompts(), max_new_tokens=4, **NO_EOS)]
    text = out[0].sequences
    loss = call(input_ids=text, attention_mask=grown(prompts()["attention_mask"], 4), labels=text).loss
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    out += [loss.detach(), call.generate(**prompts(), max_new_tokens=4, **NO_EOS)]
    for module in model.modules():
        if isinstance(module, LoRA):
            module.enabled = False
    return out + [call.generate(**prompts(), max_new_tokens=4, **NO_EOS)]


def sampled_by_hand(call, model):
    """A user's sampling loop from a seeded generator: the cache passed back as the output gave
    it, finished rows fed the pad token, the loop ending when every row has ended."""
    generator, (ids, mask) = torch.Generator().manual_seed(3), prompts().values()
    cache, feed, done, out = None, ids, torch.zeros(3, dtype=torch.bool), []
    with torch.no_grad():
        for _ in range(8):
            step = call(input_ids=feed, attention_mask=mask, cache=cache, use_cache=True)
            cache = step.past_key_values
            token = torch.multinomial((step.logits[:, -1] / 0.7).softmax(-1), 1, generator=generator).squeeze(1)
            token = torch.where(done, torch.zeros_like(token), token)
            done = done | (token % 5 == 2)
            out.append(token)
            feed, mask = token[:, None], grown(mask)
            if done.all():
                break
    return torch.stack(out, 1), cache, generator.get_state()


def reordered_between_calls(call, model):
    """Beams by hand: the cache reordered (``reorder_cache``) between the compiled calls."""
    cache, (ids, mask), out = T.DynamicCache(config=model.config), prompts().values(), []
    with torch.no_grad():
        step = call(input_ids=ids, attention_mask=mask, cache=cache, use_cache=True)
        for i in range(4):
            beams = torch.tensor([(i + 1) % 3, 0, 2])
            cache.reorder_cache(beams)
            mask = grown(mask.index_select(0, beams))
            feed = step.logits[:, -1:].argmax(-1).index_select(0, beams)
            step = call(input_ids=feed, attention_mask=mask, cache=cache, use_cache=True)
            out.append(step.logits)
    return out, cache


def assisted_by_hand(call, model):
    """Three rounds of three guessed tokens checked in one call; the cache cropped to the
    agreeing prefix (``crop`` by a negative count)."""
    cache, ids = T.DynamicCache(config=model.config), prompts(batch=1)["input_ids"]
    with torch.no_grad():
        token = call(input_ids=ids, cache=cache, use_cache=True).logits[:, -1:].argmax(-1)
        for _ in range(3):
            guess = torch.cat([token, (token * 7 + torch.arange(1, 3)[None]) % VOCAB], 1)
            predicted = call(input_ids=guess, cache=cache, use_cache=True).logits.argmax(-1)
            n = int((predicted[:, :-1] == guess[:, 1:]).cumprod(1).sum())
            ids = torch.cat([ids, guess[:, : n + 1]], 1)
            cache.crop(ids.shape[1] - cache.get_seq_length())
            token = predicted[:, n : n + 1]
    return ids, token, cache


def static_sliding(call, model):
    """A ``StaticCache`` over Mistral's window of 5 (sliding layers) past the window, with a
    ``cache_position`` and a mask of the cache's length filled as positions are."""
    cache, (ids, prompt_mask) = T.StaticCache(config=model.config, max_cache_len=20), prompts().values()
    mask = torch.cat([prompt_mask, torch.zeros(3, 13, dtype=torch.long)], 1)
    position, logits = torch.arange(ids.shape[1]), []
    with torch.no_grad():
        for _ in range(10):
            mask[:, position] = 1
            step = call(input_ids=ids, attention_mask=mask, cache=cache, cache_position=position, use_cache=True)
            logits.append(step.logits)
            ids, position = step.logits[:, -1:].argmax(-1), position[-1:] + 1
    return logits, cache


def streamed(call, model):
    """A Python generator yielding a token a step over its own cache, stopped after seven."""

    def stream():
        cache, feed = T.DynamicCache(config=model.config), prompts(batch=1)["input_ids"]
        with torch.no_grad():
            while True:
                feed = call(input_ids=feed, cache=cache, use_cache=True).logits[:, -1:].argmax(-1)
                yield feed, cache

    got = []
    for token, cache in stream():
        got.append(token)
        if len(got) == 7:
            break
    return got, cache


#: name -> (the recipe, the model, compiles with the module jitted, with its forward jitted).
#: The forward jitted reads the module's buffers as attributes of ``self``: ``model.to`` makes new
#: ones (RoPE's ``inv_freq``), so the float32 generate after the bfloat16 one compiles again.
RECIPES = {
    "beam_sample": (beam_sample, llama, 2, 2),
    "static_beams": (static_beams, llama, 2, 2),
    "several_ends": (several_ends, llama, 2, 2),
    "custom_generate": (custom_generate, llama, 2, 2),
    "contrastive": (contrastive, llama, 2, None),  # (the forward jitted: refused, below)
    "from_embeddings": (from_embeddings, llama, 3, 3),  # (the embeddings, the first token, the rest)
    "reinforce": (reinforce, llama, 3, 3),  # + the training forward
    "sampled_then_trained_with_dropout": (sampled_then_trained_with_dropout, dropout_llama, 3, 3),
    "bfloat16_and_back": (bfloat16_and_back, llama, 4, 6),
    "lora_session": (lora_session, lora_llama, 5, 5),  # + training, + the adapters off (a guard)
    "sampled_by_hand": (sampled_by_hand, llama, 3, 3),  # (the first call without a cache)
    "reordered_between_calls": (reordered_between_calls, llama, 2, 2),
    "assisted_by_hand": (assisted_by_hand, llama, 4, 4),  # the guesses' and the crops' lengths
    "static_sliding": (static_sliding, mistral, 3, 3),  # + the window full
    "streamed": (streamed, llama, 3, 3),
}


@pytest.mark.parametrize("name", RECIPES)
def test_a_generate_recipe_on_the_jitted_module_is_eagers(name):
    recipe, build, compiles, _ = RECIPES[name]
    assert generates_as_eager(recipe, "jit", build) == compiles


@SLOW
@pytest.mark.parametrize("name", RECIPES)
def test_a_generate_recipe_with_the_forward_jitted_is_eagers(name):
    recipe, build, _, compiles = RECIPES[name]
    if compiles is None:
        pytest.skip("refused: test_hidden_states_with_only_the_forward_jitted_are_refused_naming_transformers_flag")
    assert generates_as_eager(recipe, "forward", build) == compiles


@SLOW  # (Dynamo's tracing of the forward: 10 to 40 s a recipe)
@pytest.mark.parametrize("name", ["beam_sample", "reinforce", "sampled_by_hand", "bfloat16_and_back", "streamed"])
def test_a_generate_recipe_with_the_forward_compiled_by_dynamo_is_dynamos_eager(name):
    recipe, build, _, _ = RECIPES[name]
    counts = generates_as_eager(recipe, "compile", build)
    assert max(counts) <= 3, counts


def test_hidden_states_with_only_the_forward_jitted_are_refused_naming_transformers_flag():
    """transformers installs its output-capturing hooks on the first call asking for hidden states
    and marks the inner model (``_output_capturing_hooks_installed``). With the whole module
    jitted that attribute write is repeated (the contrastive recipe above); with only the bound
    ``forward`` jitted the inner model is state the function reached, whose attribute writes a
    compiled call cannot repeat: refused naming the attribute, the line, and the whole-module jit."""
    torch.manual_seed(0)
    model = llama().eval()
    model.forward = thunder_rs.jit(model.forward)
    with (
        torch.no_grad(),
        pytest.raises(NotImplementedError, match=r"_output_capturing_hooks_installed.*thunder_rs\.jit\(model\)"),
    ):
        model.generate(**prompts(), custom_generate=contrastive_search)


# ------------------------------------------------------------------ an FP8-quantized cache


def test_an_fp8_quantized_cache_is_refused_naming_the_cast_and_left_as_it_was():
    """The first call's cast of the keys to ``float8_e4m3fn`` is refused naming ``Tensor.to``
    and the line; the cache's layers are as they were, so eager then runs on the same cache as
    on a fresh one."""
    model = llama().eval()
    cache, fresh = (T.QuantizedCache(backend="fp8", config=model.config) for _ in range(2))
    before = [dict(vars(layer)) for layer in cache.layers]
    with torch.no_grad():
        with pytest.raises(ThunderTypeError, match=r"ltorch\.to: .*float8_e4m3fn, called at .*cache_utils\.py:\d+"):
            thunder_rs.jit(model)(**prompts(), cache=cache, use_cache=True)
        assert [vars(layer) for layer in cache.layers] == before
        got = model(**prompts(), cache=cache, use_cache=True).logits
        expected = model(**prompts(), cache=fresh, use_cache=True).logits
    assert torch.equal(got, expected)


def test_generate_with_an_fp8_quantized_cache_is_refused_and_eagers_generate_runs_after():
    model = llama().eval()
    quantized = dict(cache_implementation="quantized", cache_config={"backend": "fp8"}, max_new_tokens=4, **NO_EOS)
    with pytest.raises(ThunderTypeError, match="float8_e4m3fn"):
        thunder_rs.jit(model).generate(**prompts(), **quantized)
    assert_same(
        flat(model.generate(**prompts(), **quantized)), flat(copy.deepcopy(model).generate(**prompts(), **quantized))
    )
