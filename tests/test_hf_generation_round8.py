"""KV-cache generation recipes under ``thunder_rs.jit(model)`` next to eager, round 8: what the
other generation tests leave out. Continuing a chat from the cache a generate returned (dynamic,
sliding and static), a prompt's cache deep-copied for several continuations, a ``StaticCache``
reused and reset by generates of other batches and lengths, ``cache_implementation`` "sliding_window"
and "hybrid", chunked prefill, EOS and a user's stopping criterion ending rows in the middle of a
batch, beam search whose rows end early, ``use_cache=False``, the logits processors, assisted and
prompt-lookup decoding (a tiny draft, jitted or not), a streamer, encoder-decoders' beams, sampling,
static caches and continued generates, and the loops a user writes: a ``DynamicCache`` and
``cache_position``, a ``StaticCache``, the cache reordered (``index_select``) or cropped inside
the jitted step, a seeded ``torch.Generator`` drawn inside it. Each: eager's tokens, scores and
logits bit for bit, the cache after the call as eager's (its layers' tensors, strides and counts),
the global RNG state as eager's, and the compiles counted (in each table of recipes, measured: a recipe that
compiles more than that is a regression to explain). Tiny configs built in code.

Some with the forward compiled by ``torch.compile(backend="thunder_rs")``, next to Dynamo's own
``backend="eager"``: each of Dynamo's graphs compiled once.

What differed: a chat continued outside ``torch.inference_mode()`` from the cache a generate
filled under it compiled every token (its keys are inference tensors: the check for eager's
inference-tensor errors made meta tensors of the symbolic sizes, which failed, and symbolic
compiles stopped for the model). A ``DynamicCache()`` made without the model's config, which
makes its layers in the first call, stays refused naming it (``test_kv_cache``), and now the
user's line that made the call.
"""

import copy

import pytest
import torch

import thunder_rs

transformers = pytest.importorskip("transformers")
if int(transformers.__version__.split(".")[0]) < 5:
    pytest.skip("transformers 5's cache layers (Cache.layers)", allow_module_level=True)

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.filterwarnings("ignore:thunder_rs.*recompiled"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore:.*generation.*:UserWarning"),
]
T = transformers
VOCAB = 99
SLOW = pytest.mark.slow
COMMON = dict(vocab_size=VOCAB, pad_token_id=0, bos_token_id=1, eos_token_id=2)
BODY = dict(
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    hidden_size=32,
    intermediate_size=64,
    max_position_embeddings=128,
    **COMMON,
)
SEQ2SEQ = dict(
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=2,
    decoder_attention_heads=2,
    d_model=32,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
    max_position_embeddings=64,
    decoder_start_token_id=0,
    **COMMON,
)
F64 = torch.float64
MODELS = {
    "llama": lambda: T.LlamaForCausalLM(T.LlamaConfig(**BODY)),
    "llama_bf16": lambda: T.LlamaForCausalLM(T.LlamaConfig(**BODY)).to(torch.bfloat16),
    "llama_eager_attention": lambda: T.LlamaForCausalLM(T.LlamaConfig(attn_implementation="eager", **BODY)),
    "mistral": lambda: T.MistralForCausalLM(T.MistralConfig(sliding_window=8, **BODY)),
    "gemma2": lambda: T.Gemma2ForCausalLM(T.Gemma2Config(head_dim=8, sliding_window=4, **BODY)).to(F64),
    "gemma3": lambda: T.Gemma3ForCausalLM(T.Gemma3TextConfig(head_dim=8, sliding_window=4, **BODY)).to(F64),
    "t5": lambda: T.T5ForConditionalGeneration(
        T.T5Config(num_layers=2, num_heads=2, d_model=32, d_kv=16, d_ff=64, decoder_start_token_id=0, **COMMON)
    ),
    "bart": lambda: T.BartForConditionalGeneration(
        T.BartConfig(**SEQ2SEQ, forced_eos_token_id=None, forced_bos_token_id=None)
    ),
    "whisper": lambda: T.WhisperForConditionalGeneration(
        T.WhisperConfig(num_mel_bins=8, max_source_positions=8, max_target_positions=64, **SEQ2SEQ)
    ).to(F64),
}
#: what every generate returns: the scores after the processors and the raw logits of each step
RETURNED = dict(pad_token_id=0, return_dict_in_generate=True, output_scores=True, output_logits=True)
NO_EOS = dict(RETURNED, eos_token_id=None)


def tiny(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return MODELS[name]().eval()


def prompts(seed: int = 1, batch: int = 3, length: int = 7) -> dict:
    """Prompts of ``length``, ``length - 3`` and ``length - 1`` tokens, padded on the left."""
    ids = torch.randint(3, VOCAB, (3, length), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(ids)
    for row, pads in ((1, 3), (2, 1)):
        ids[row, :pads], mask[row, :pads] = 0, 0
    return dict(input_ids=ids[:batch], attention_mask=mask[:batch])


def source(model) -> dict:
    """An encoder-decoder's source: two texts (the second padded on the right), or Whisper's features."""
    if model.config.model_type == "whisper":  # 16 frames of 8 mel bins: the encoder's 8 positions
        return dict(input_features=torch.randn(2, 8, 16, dtype=F64, generator=torch.Generator().manual_seed(1)))
    ids = torch.randint(3, VOCAB, (2, 6), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    ids[1, 4:], mask[1, 4:] = 0, 0
    return dict(input_ids=ids, attention_mask=mask)


def assert_same(got, expected, path: str = "result") -> None:
    """``got`` is ``expected``: tensors bit for bit (dtype, shape, strides of a cache's tensors),
    a cache's layers as eager's (their types, tensors and counts), containers item by item."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(got, torch.Tensor), path
        torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True, msg=lambda m: f"{path}: {m}")
    elif isinstance(expected, dict):  # (a ModelOutput too: its fields that are set)
        assert list(got.keys()) == list(expected.keys()), path
        for key in expected:
            assert_same(got[key], expected[key], f"{path}[{key!r}]")
    elif isinstance(expected, (list, tuple)):
        assert type(got) is type(expected) and len(got) == len(expected), path
        for i, (g, e) in enumerate(zip(got, expected)):
            assert_same(g, e, f"{path}[{i}]")
    elif isinstance(expected, T.EncoderDecoderCache):
        assert type(got) is type(expected), path
        assert dict(got.is_updated) == dict(expected.is_updated), path
        assert_same(got.self_attention_cache, expected.self_attention_cache, f"{path}.self_attention_cache")
        assert_same(got.cross_attention_cache, expected.cross_attention_cache, f"{path}.cross_attention_cache")
    elif isinstance(expected, T.Cache):
        assert type(got) is type(expected) and len(got.layers) == len(expected.layers), path
        for i, (layer, ref) in enumerate(zip(got.layers, expected.layers)):
            assert type(layer) is type(ref) and vars(layer).keys() == vars(ref).keys(), f"{path}.layers[{i}]"
            for name, value in vars(ref).items():
                assert_same(vars(layer)[name], value, f"{path}.layers[{i}].{name}")
                if isinstance(value, torch.Tensor):
                    assert vars(layer)[name].stride() == value.stride(), f"{path}.layers[{i}].{name}"
    else:
        assert got == expected, f"{path}: {got!r} != {expected!r}"


def as_eager(name: str, recipe, jit=thunder_rs.jit):
    """``recipe(call, model)`` with ``call`` the model jitted, then eager, from the same seed:
    the same results, caches and RNG state. The jitted model's compile stats."""
    model = tiny(name)
    eager, jmodel = copy.deepcopy(model), jit(model)
    torch.manual_seed(7)
    expected = recipe(eager, eager), torch.get_rng_state()
    torch.manual_seed(7)
    got = recipe(jmodel, model), torch.get_rng_state()
    assert_same(got, expected)
    stats = thunder_rs.compile_stats(jmodel)
    assert stats.eager_calls == 0, stats
    return stats


def chat(call, model):
    """A first turn, then a second continuing it: its text is the first's with three more tokens,
    its cache the one the first returned (``generate`` prefills only the new tokens)."""
    first = call.generate(**prompts(), max_new_tokens=6, **NO_EOS)
    more = torch.randint(3, VOCAB, (3, 3), generator=torch.Generator().manual_seed(4))
    ids = torch.cat([first.sequences, more], 1)
    mask = torch.cat([prompts()["attention_mask"], torch.ones(3, 9, dtype=torch.long)], 1)
    second = call.generate(
        input_ids=ids, attention_mask=mask, past_key_values=first.past_key_values, max_new_tokens=6, **NO_EOS
    )
    return first, second


def chat_four_turns(call, model):
    """Four turns, each continuing the last's text and cache with 0, 3, 2 and 4 new tokens."""
    outs, cache = [], None
    ids, mask = prompts().values()
    for more in (0, 3, 2, 4):
        if more:
            tail = torch.randint(3, VOCAB, (3, more), generator=torch.Generator().manual_seed(more))
            ids = torch.cat([outs[-1].sequences, tail], 1)
            mask = torch.cat([mask, torch.ones(3, ids.shape[1] - mask.shape[1], dtype=torch.long)], 1)
        outs.append(
            call.generate(input_ids=ids, attention_mask=mask, past_key_values=cache, max_new_tokens=4, **NO_EOS)
        )
        cache = outs[-1].past_key_values
        mask = torch.cat([mask, torch.ones(3, outs[-1].sequences.shape[1] - mask.shape[1], dtype=torch.long)], 1)
    return outs


def chat_after_inference_mode(call, model):
    """A first turn under ``torch.inference_mode()`` (its cache of inference tensors), the second
    outside it continuing that cache. The second turn compiled every step: a symbolic compile of
    the inference keys failed (``inference.check_call``'s meta tensors of symbolic sizes)."""
    with torch.inference_mode():
        first = call.generate(**prompts(), max_new_tokens=4, **NO_EOS)
    mask = torch.cat([prompts()["attention_mask"], torch.ones(3, 4, dtype=torch.long)], 1)
    second = call.generate(
        input_ids=first.sequences,
        attention_mask=mask,
        past_key_values=first.past_key_values,
        max_new_tokens=8,
        **NO_EOS,
    )
    return first, second


def static_chat(call, model):
    """Two turns writing one ``StaticCache`` the user made."""
    cache = T.StaticCache(config=model.config, max_cache_len=40)
    first = call.generate(**prompts(), max_new_tokens=6, past_key_values=cache, **NO_EOS)
    more = torch.randint(3, VOCAB, (3, 3), generator=torch.Generator().manual_seed(4))
    ids = torch.cat([first.sequences, more], 1)
    mask = torch.cat([prompts()["attention_mask"], torch.ones(3, 9, dtype=torch.long)], 1)
    second = call.generate(input_ids=ids, attention_mask=mask, past_key_values=cache, max_new_tokens=6, **NO_EOS)
    return first, second, cache


def prefix_cache(call, model):
    """transformers' "re-use a prompt's cache": the prompt's cache filled by a forward, then a deep
    copy of it continued by each generate (with 2, then 3 tokens more)."""
    prompt_cache = T.DynamicCache(config=model.config)
    with torch.no_grad():
        call(**prompts(), past_key_values=prompt_cache, use_cache=True)
    outs = []
    for more in (2, 3):
        tail = torch.randint(3, VOCAB, (3, more), generator=torch.Generator().manual_seed(more))
        ids = torch.cat([prompts()["input_ids"], tail], 1)
        mask = torch.cat([prompts()["attention_mask"], torch.ones_like(tail)], 1)
        past = copy.deepcopy(prompt_cache)
        outs.append(call.generate(input_ids=ids, attention_mask=mask, past_key_values=past, max_new_tokens=5, **NO_EOS))
    return outs, prompt_cache


def static_reused(call, model):
    """generate keeps its static cache on the model and resets it for the next generate that fits
    (other prompt lengths), makes another for another batch."""
    shapes = ((1, 3, 7), (2, 3, 5), (3, 2, 6), (4, 3, 7))
    return [
        call.generate(**prompts(seed, batch, length), max_new_tokens=5, cache_implementation="static", **NO_EOS)
        for seed, batch, length in shapes
    ]


def trained_through_the_cache(call, model):
    """Four forwards with grad mode on, each reading the cache the last wrote (its tensors outputs
    of the last compiled call), then one backward through all of them: eager's gradients."""
    cache, total, logits = T.DynamicCache(config=model.config), 0, []
    ids, mask = prompts().values()
    for _ in range(4):
        out = call(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True)
        logits.append(out.logits)
        total = total + out.logits[:, -1].logsumexp(-1).sum()
        ids = out.logits[:, -1:].argmax(-1)
        mask = torch.cat([mask, torch.ones(3, 1, dtype=mask.dtype)], 1)
    total.backward()
    return logits, total, [p.grad for p in model.parameters()], cache


def under_autocast(call, model):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return call.generate(**prompts(), max_new_tokens=6, **NO_EOS)


class EndsOnMultiplesOf7(T.StoppingCriteria):
    def __call__(self, input_ids, scores, **kwargs):
        return input_ids[:, -1] % 7 == 0


def _streamed(call, model):
    class Recorder(T.generation.streamers.BaseStreamer):
        def __init__(self):
            self.seen: list = []

        def put(self, value):
            self.seen.append(value.clone())

        def end(self):
            self.seen.append("end")

    recorder = Recorder()
    return call.generate(**prompts(batch=1), max_new_tokens=5, streamer=recorder, **NO_EOS), recorder.seen


def assisted(call, model, **options):
    """Assisted decoding by a one-layer draft, jitted as the model is."""
    torch.manual_seed(1)
    draft = T.LlamaForCausalLM(T.LlamaConfig(**dict(BODY, num_hidden_layers=1))).eval()
    draft = thunder_rs.jit(draft) if call is not model else draft
    return call.generate(**prompts(batch=1), max_new_tokens=8, assistant_model=draft, **NO_EOS, **options)


def generated(**options):
    return lambda call, model: call.generate(**prompts(), **options)


PROCESSORS = dict(
    min_new_tokens=3,
    bad_words_ids=[[5], [6, 7]],
    forced_eos_token_id=2,
    sequence_bias={(8,): -5.0},
    suppress_tokens=[9],
)
SAMPLED = dict(do_sample=True, top_k=10, top_p=0.8, temperature=0.7, repetition_penalty=1.2, no_repeat_ngram_size=2)
EOS_IN_THE_MIDDLE = dict(RETURNED, eos_token_id=[5, 17, 40, 60, 2])
#: recipe -> (model, the recipe, compiles): the prompt, the first step, more where said
RECIPES = {
    "chat": ("llama", chat, 4),  # + the second turn's prompt, and its steps: generate set cache._is_user_defined
    "chat_sliding": ("mistral", chat, 5),  # + the window's count symbolic from the second step
    "chat_hybrid": ("gemma2", chat, 5),
    "chat_four_turns": ("llama", chat_four_turns, 4),  # (as two: the later turns are served)
    "chat_four_turns_sliding": ("mistral", chat_four_turns, 5),
    "chat_four_turns_hybrid": ("gemma2", chat_four_turns, 5),
    # + the second turn's first step (its keys inference tensors), then its steps
    "chat_after_inference_mode": ("llama", chat_after_inference_mode, 4),
    "trained_through_the_cache": ("llama", trained_through_the_cache, 2),
    "under_autocast": ("llama", under_autocast, 2),
    "static_chat": ("llama", static_chat, 3),
    "static_chat_hybrid": ("gemma3", static_chat, 3),
    "prefix_cache": ("llama", prefix_cache, 4),  # the forward, the prompts of 2 and 3 tokens, the steps
    "static_reused": ("llama", static_reused, 5),  # + prompts of other lengths, then of another batch
    "eos_in_the_middle": ("llama", generated(max_new_tokens=12, **EOS_IN_THE_MIDDLE), 2),
    "stopping_criteria": (
        "llama",
        generated(max_new_tokens=12, stopping_criteria=T.StoppingCriteriaList([EndsOnMultiplesOf7()]), **NO_EOS),
        2,
    ),
    "beams_ending_early": (
        "llama",
        generated(max_new_tokens=8, num_beams=3, early_stopping=True, **EOS_IN_THE_MIDDLE),
        2,
    ),
    "beams_returning_two": (
        "llama",
        generated(max_new_tokens=6, num_beams=3, num_return_sequences=2, length_penalty=0.5, **NO_EOS),
        2,
    ),
    "sampled": ("llama", generated(max_new_tokens=6, **SAMPLED, **NO_EOS), 2),
    "processors": ("llama", generated(max_new_tokens=6, **PROCESSORS, **NO_EOS), 2),
    "no_cache": ("llama", generated(max_new_tokens=5, use_cache=False, **NO_EOS), 2),
    "chunked_prefill": ("llama", generated(max_new_tokens=6, prefill_chunk_size=3, **NO_EOS), 4),
    "bfloat16": ("llama_bf16", generated(max_new_tokens=8, **NO_EOS), 2),
    "attentions_and_states": (
        "llama_eager_attention",
        generated(max_new_tokens=4, output_attentions=True, output_hidden_states=True, **NO_EOS),
        2,
    ),
    "static": ("llama", generated(max_new_tokens=6, cache_implementation="static", **NO_EOS), 2),
    "static_hybrid": ("gemma3", generated(max_new_tokens=6, cache_implementation="static", **NO_EOS), 2),
    "sliding_window": ("mistral", generated(max_new_tokens=12, cache_implementation="sliding_window", **NO_EOS), 3),
    "hybrid": ("gemma2", generated(max_new_tokens=12, cache_implementation="hybrid", **NO_EOS), 3),
    "streamer": ("llama", _streamed, 3),  # (a batch of one: its prompt's batch held constant)
    "assisted": ("llama", assisted, 5),  # the candidates' lengths, and the cache cropped to the accepted
    "assisted_sampled": ("llama", lambda call, model: assisted(call, model, do_sample=True), 6),
    "prompt_lookup": (
        "llama",
        lambda c, m: c.generate(**prompts(batch=1), max_new_tokens=8, prompt_lookup_num_tokens=3, **NO_EOS),
        5,
    ),
}
DEFAULT_RUN = {
    "chat",
    "chat_after_inference_mode",
    "static_chat",
    "eos_in_the_middle",
    "beams_ending_early",
    "sampled",
    "assisted",
    "hybrid",
    "prefix_cache",
    "static_reused",
    "trained_through_the_cache",
    "chat_four_turns_hybrid",
    "stopping_criteria",
}


@pytest.mark.parametrize("recipe", [r if r in DEFAULT_RUN else pytest.param(r, marks=SLOW) for r in RECIPES])
def test_a_decoders_generate_recipe_is_eagers_in_few_compiles(recipe):
    name, run, compiles = RECIPES[recipe]
    stats = as_eager(name, run)
    assert stats.cache_misses == compiles, stats.miss_reasons


def seq2seq_chat(call, model):
    """A second generate continuing the first's decoder tokens with the cache it returned (its
    cross-attention filled: ``is_updated``)."""
    first = call.generate(**source(model), max_new_tokens=4, **RETURNED)
    second = call.generate(
        **source(model),
        decoder_input_ids=first.sequences,
        past_key_values=first.past_key_values,
        max_new_tokens=4,
        **RETURNED,
    )
    return first, second


def seq2seq_loop(call, model):
    """A user's decoding loop over the encoder's states, with an ``EncoderDecoderCache``."""
    cache = T.EncoderDecoderCache(T.DynamicCache(config=model.config), T.DynamicCache(config=model.config))
    src, tokens, logits = source(model), torch.zeros(2, 1, dtype=torch.long), []
    with torch.no_grad():
        states = model.get_encoder()(**src)
        for _ in range(5):
            out = call(encoder_outputs=states, attention_mask=src.get("attention_mask"), decoder_input_ids=tokens,
                       past_key_values=cache, use_cache=True)  # fmt: skip
            logits.append(out.logits)
            tokens = out.logits[:, -1:].argmax(-1)
    return logits, cache


def seq2seq_assisted(call, model):
    torch.manual_seed(1)
    draft = copy.deepcopy(model)
    return call.generate(**{k: v[:1] for k, v in source(model).items()}, max_new_tokens=6, assistant_model=draft,
                         **RETURNED)  # fmt: skip


def seq2seq_after_inference_mode(call, model):
    """A generate under ``torch.inference_mode()``, then beams outside it."""
    with torch.inference_mode():
        first = call.generate(**source(model), max_new_tokens=4, **RETURNED)
    return first, call.generate(**source(model), max_new_tokens=6, num_beams=2, **RETURNED)


def seq2seq(**options):
    return lambda call, model: call.generate(**source(model), **options, **RETURNED)


#: the decoder's first token, the second with the self-attention cache filled, then its length
#: symbolic; a continued generate: its prompt (its layers' ``device`` set by the first turn's
#: ``lazy_initialization``), then its steps
SEQ2SEQ_RECIPES = {
    "t5_beams": ("t5", seq2seq(max_new_tokens=8, num_beams=3, num_return_sequences=2), 3),
    "bart_sampled": ("bart", seq2seq(max_new_tokens=8, do_sample=True, top_p=0.9, repetition_penalty=1.3), 3),
    "t5_no_cache": ("t5", seq2seq(max_new_tokens=5, use_cache=False), 2),
    "t5_static": ("t5", seq2seq(max_new_tokens=6, cache_implementation="static"), 2),
    "bart_static": ("bart", seq2seq(max_new_tokens=6, cache_implementation="static"), 2),
    "whisper_beams": ("whisper", seq2seq(max_new_tokens=8, num_beams=3), 3),
    "t5_chat": ("t5", seq2seq_chat, 5),
    "bart_chat": ("bart", seq2seq_chat, 5),
    "t5_loop": ("t5", seq2seq_loop, 3),
    "t5_after_inference_mode": ("t5", seq2seq_after_inference_mode, 6),  # three under it, three outside
    "whisper_after_inference_mode": ("whisper", seq2seq_after_inference_mode, 6),
    "bart_assisted": ("bart", seq2seq_assisted, 3),
}


SEQ2SEQ_DEFAULT_RUN = {"t5_chat", "bart_sampled", "t5_after_inference_mode"}


@pytest.mark.parametrize(
    "recipe", [r if r in SEQ2SEQ_DEFAULT_RUN else pytest.param(r, marks=SLOW) for r in SEQ2SEQ_RECIPES]
)
def test_an_encoder_decoders_generate_recipe_is_eagers_in_few_compiles(recipe):
    name, run, compiles = SEQ2SEQ_RECIPES[recipe]
    stats = as_eager(name, run)
    assert stats.cache_misses == compiles, stats.miss_reasons


def cache_position_loop(call, model):
    """A user's greedy loop: ``model(ids, past_key_values=cache, cache_position=...)``."""
    cache = T.DynamicCache(config=model.config)
    ids, mask = prompts().values()
    position, logits = torch.arange(ids.shape[1]), []
    with torch.no_grad():
        for _ in range(6):
            out = call(
                input_ids=ids, attention_mask=mask, past_key_values=cache, cache_position=position, use_cache=True
            )
            logits.append(out.logits)
            ids = out.logits[:, -1:].argmax(-1)
            mask = torch.cat([mask, torch.ones(3, 1, dtype=mask.dtype)], 1)
            position = position[-1:] + 1
    return logits, cache


def static_loop(call, model):
    """The same with a ``StaticCache`` of 20 and a mask of 20 filled as the positions are."""
    cache = T.StaticCache(config=model.config, max_cache_len=20)
    ids, prompt_mask = prompts().values()
    mask = torch.cat([prompt_mask, torch.zeros(3, 13, dtype=torch.long)], 1)
    position, logits = torch.arange(ids.shape[1]), []
    with torch.no_grad():
        for _ in range(6):
            mask[:, position] = 1
            out = call(
                input_ids=ids, attention_mask=mask, past_key_values=cache, cache_position=position, use_cache=True
            )
            logits.append(out.logits)
            ids = out.logits[:, -1:].argmax(-1)
            position = position[-1:] + 1
    return logits, cache


LOOPS = {
    "cache_position": ("llama", cache_position_loop, 2),
    "static": ("llama", static_loop, 2),
    "sliding_window": ("mistral", cache_position_loop, 3),
    "hybrid": ("gemma2", cache_position_loop, 3),
}


@pytest.mark.parametrize("loop", [n if n == "cache_position" else pytest.param(n, marks=SLOW) for n in LOOPS])
def test_a_users_decoding_loop_over_a_jitted_model_is_eagers(loop):
    name, run, compiles = LOOPS[loop]
    stats = as_eager(name, run)
    assert stats.cache_misses == compiles, stats.miss_reasons


def reordered_step(model, ids, cache, beams):
    cache.reorder_cache(beams)  # (each layer's keys and values: index_select of the beams)
    return model(input_ids=ids, past_key_values=cache, use_cache=True).logits


def cropped_step(model, ids, cache, drop):
    cache.crop(drop)  # (assisted decoding's rejected candidates)
    return model(input_ids=ids, past_key_values=cache, use_cache=True).logits


def sampled_step(model, ids, cache, generator):
    logits = model(input_ids=ids, past_key_values=cache, use_cache=True).logits[:, -1]
    return torch.multinomial(torch.softmax(logits / 0.7, -1), 1, generator=generator)


def _stepped(kind: str, step, model) -> tuple:
    """Four calls of ``step`` after the prompt's forward (the sampler's first call is the prompt)."""
    cache, generator = T.DynamicCache(config=model.config), torch.Generator().manual_seed(11)
    ids, outs = prompts()["input_ids"], []
    with torch.no_grad():
        if kind != "sampled":
            model(input_ids=ids, past_key_values=cache, use_cache=True)
        for i in range(4):
            if kind == "reordered":
                outs.append(step(model, torch.full((3, 1), 5 + i), cache, torch.tensor([(i + 1) % 3, 0, 2])))
            elif kind == "cropped":
                outs.append(step(model, torch.full((3, 2), 5 + i), cache, -1 - i % 2))
            else:
                ids = step(model, ids, cache, generator)
                outs.append(ids)
    return outs, cache, generator.get_state()


#: the step jitted, its compiles: the first call, then the cache's length symbolic (the cropped
#: step's count too; the sampler's first call is the prompt's)
STEPS = {"reordered": (reordered_step, 2), "cropped": (cropped_step, 3), "sampled": (sampled_step, 3)}


@pytest.mark.parametrize("kind", STEPS)
def test_a_jitted_step_reordering_cropping_or_drawing_from_the_cache_is_eagers(kind):
    step, compiles = STEPS[kind]
    model = tiny("llama")
    jstep = thunder_rs.jit(step)
    torch.manual_seed(7)
    expected = _stepped(kind, step, copy.deepcopy(model)), torch.get_rng_state()
    torch.manual_seed(7)
    got = _stepped(kind, jstep, model), torch.get_rng_state()
    assert_same(got, expected)
    stats = thunder_rs.compile_stats(jstep)
    assert (stats.cache_misses, stats.eager_calls) == (compiles, 0), stats.miss_reasons


def greedy_decode(model, ids, steps: int = 4):
    """The whole loop in one jitted program: its cache made in it and returned."""
    cache, tokens = T.DynamicCache(config=model.config), []
    for _ in range(steps):
        ids = model(input_ids=ids, past_key_values=cache, use_cache=True).logits[:, -1:].argmax(-1)
        tokens.append(ids)
    return torch.cat(tokens, 1), cache


def test_a_jitted_decoding_loop_making_its_own_cache_is_eagers_in_one_compile():
    model = tiny("llama")
    jdecode = thunder_rs.jit(greedy_decode)
    with torch.no_grad():
        expected = greedy_decode(copy.deepcopy(model), prompts()["input_ids"])
        assert_same(jdecode(model, prompts()["input_ids"]), expected)
        assert_same(jdecode(model, prompts()["input_ids"]), expected)
    stats = thunder_rs.compile_stats(jdecode)
    assert (stats.cache_misses, stats.cache_hits) == (1, 1), stats.miss_reasons


def dynamo_as_eager(name: str, recipe) -> list:
    """``recipe`` with the model's forward compiled by Dynamo for thunder_rs, then for Dynamo's
    own ``backend="eager"`` (transformers takes other paths when it is told it is compiled): the
    same results, caches and RNG state. How often thunder_rs compiled each of Dynamo's graphs."""
    results, compiles = [], []
    for backend in ("thunder_rs", "eager"):
        torch._dynamo.reset()
        model = tiny(name)
        model.forward = torch.compile(model.forward, backend=backend)
        torch.manual_seed(7)
        results.append((recipe(model, model), torch.get_rng_state()))
        if backend == "thunder_rs":
            compiles = [thunder_rs.compile_stats(g.jitted).cache_misses for g in thunder_rs.dynamo.compiled_graphs()]
    assert_same(*results)
    return compiles


#: recipe -> (model, the recipe, how many graphs Dynamo made; thunder_rs compiles each once)
DYNAMO_RECIPES = {
    "chat": ("llama", chat, 4),
    "eos_in_the_middle": RECIPES["eos_in_the_middle"][:2] + (3,),
    "cache_position_loop": ("llama", cache_position_loop, 3),
}


@SLOW  # (Dynamo's tracing of each graph: 25 to 60 s a recipe for both backends)
@pytest.mark.parametrize("recipe", DYNAMO_RECIPES)
def test_a_recipe_with_the_forward_compiled_by_dynamo_is_dynamos_eager(recipe):
    name, run, graphs = DYNAMO_RECIPES[recipe]
    compiles = dynamo_as_eager(name, run)
    assert compiles == [1] * graphs, compiles


def test_a_loop_with_a_dynamic_cache_made_without_the_config_is_refused_naming_the_users_call():
    # transformers' documented loop makes ``DynamicCache()``, whose layers its first update makes
    # in the call: refused (``test_kv_cache``), now naming the user's line that made the call.
    model = tiny("llama")
    cache = T.DynamicCache()
    with torch.no_grad(), pytest.raises(Exception, match=r"DynamicCache\(config=model.config\)") as refused:
        thunder_rs.jit(model)(**prompts(), past_key_values=cache, use_cache=True)
    assert f"{__file__}:{refused.tb.tb_lineno}" in str(refused.value)
    assert cache.layers == []  # as it was
